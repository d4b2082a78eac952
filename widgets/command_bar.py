"""CommandBar: the chosen point's command line, selectable, with "Copy command" and "Run it in a window"
(a view: the app copies the text when sigCopy fires, and starts the server when sigRun does)."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget


class CommandBar(QWidget):
    sigCopy = Signal(str)  # the command line shown
    sigRun = Signal()  # run this point in a window of its own

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._title = QLabel()  # its own line: the command line below keeps the whole width
        self._title.setWordWrap(True)
        self._title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._line = QLineEdit()
        self._line.setReadOnly(True)
        self._copy = QPushButton("Copy command")
        self._copy.setObjectName("copy-command")
        self._copy.clicked.connect(lambda: self.sigCopy.emit(self._line.text()))
        self._run = QPushButton("Run it in a window")
        self._run.setObjectName("run-point")
        self._run.setToolTip("start this server at this point, in a window whose sliders restart it")
        self._run.clicked.connect(self.sigRun)
        row = QHBoxLayout()
        row.addWidget(self._line, 1)
        row.addWidget(self._copy)
        row.addWidget(self._run)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self._title)
        layout.addLayout(row)
        self.set_command("", "")

    def set_command(self, title: str, command: str) -> None:
        """Show `command` under `title` (the point's engine, model and flags); "" hides the bar."""
        self._title.setText(title)
        self._title.setToolTip(title)
        self._line.setText(command)
        self._line.setCursorPosition(0)
        self.setVisible(bool(command))

    def command(self) -> str:
        return self._line.text()

    def title(self) -> str:
        return self._title.text()
