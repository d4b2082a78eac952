"""File -> Tune a server…: the dialog that chooses what a tuning sweep runs (engine, model, the batch /
weight-format / draft lists and the arrival rates) and shows its progress. A view: it emits what was typed
(sigStart) and sigCancel; app/gui/tune_actions.py parses, runs the sweep in a worker thread and calls
the setters back."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
)

LIST_FIELDS = {  # field -> (label, default text, tooltip)
    "batches": ("Batch sizes", "1, 4, 8", "sequences served at once (llama-server -np, vLLM --max-num-seqs, …)"),
    "formats": ("Weight formats", "bf16", "weight formats by name: llama.cpp's GGUF file types (bf16, q8_0, q4_1, "
                "q4_0, …), vLLM/SGLang's methods (fp8, awq, gptq), inferlab's own (int8, fp8-e4m3, int4)"),
    "drafts": ("Draft lengths", "0, 4", "speculative draft tokens per step; 0 = off"),
    "rates": ("Arrival rates (req/s)", "1, 4", "the seeded load generator's rates; the highest sets tokens/s"),
}


class TuneDialog(QDialog):
    sigStart = Signal(dict)  # {"engine", "model", "batches", "formats", "drafts", "rates"}: the texts typed
    sigCancel = Signal()

    def __init__(self, engines: dict[str, str], parent=None, tips: dict[str, str] | None = None) -> None:
        """engines: name -> its default weight formats' text (the formats field follows the engine chosen
        until it is edited); tips: name -> the formats field's tooltip for it."""
        super().__init__(parent)
        self.setWindowTitle("Tune a server")
        self.setModal(False)
        self._defaults, self._tips = dict(engines), dict(tips or {})
        self._engine = QComboBox()
        self._engine.addItems(list(engines))
        self._model = QLineEdit()
        self._model.setPlaceholderText("a .gguf file (llama-server), an HF folder or Hub id")
        browse = QPushButton("…")
        browse.clicked.connect(self._on_browse)
        model_row = QHBoxLayout()
        model_row.addWidget(self._model, 1)
        model_row.addWidget(browse)
        form = QFormLayout()
        form.addRow("Engine", self._engine)
        form.addRow("Model", model_row)
        self._lists: dict[str, QLineEdit] = {}
        for name, (label, default, tip) in LIST_FIELDS.items():
            edit = self._lists[name] = QLineEdit(default)
            edit.setToolTip(tip)
            form.addRow(label, edit)
        self._shown_engine = ""
        self._engine.currentTextChanged.connect(self._on_engine)
        self._on_engine(self._engine.currentText())
        self._status = QLabel("Each point starts the server with its flags, waits for /health, measures, stops it.")
        self._status.setWordWrap(True)
        self._status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._progress = QProgressBar()
        self._progress.setRange(0, 1000)
        self._progress.hide()
        self._start = QPushButton("Start")
        self._start.setObjectName("tune-start")
        self._start.setDefault(True)
        self._start.clicked.connect(lambda: self.sigStart.emit(self.values()))
        self._cancel = QPushButton("Cancel sweep")
        self._cancel.setObjectName("tune-cancel")
        self._cancel.clicked.connect(self.sigCancel)
        self._cancel.setEnabled(False)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        for b in (self._start, self._cancel, close):
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self._progress)
        layout.addWidget(self._status)
        layout.addLayout(buttons)
        self.resize(620, 0)

    # --- setters --------------------------------------------------------------------------------
    def set_values(self, values: dict) -> None:
        if "engine" in values:
            self._engine.setCurrentText(values["engine"])
        if "model" in values:
            self._model.setText(values["model"])
        for name, edit in self._lists.items():
            if name in values:
                edit.setText(values[name])

    def values(self) -> dict:
        return {"engine": self._engine.currentText(), "model": self._model.text().strip(),
                **{name: edit.text() for name, edit in self._lists.items()}}

    def set_running(self, running: bool) -> None:
        self._start.setEnabled(not running)
        self._cancel.setEnabled(running)
        self._progress.setVisible(running)
        if running:
            self._progress.setValue(0)

    def set_progress(self, text: str, fraction: float | None) -> None:
        self._status.setText(text)
        if fraction is not None:
            self._progress.setValue(round(1000 * max(0.0, min(1.0, fraction))))

    def set_status(self, text: str) -> None:
        self._status.setText(text)

    def status_text(self) -> str:
        return self._status.text()

    def is_running(self) -> bool:
        return self._cancel.isEnabled()

    def _on_engine(self, engine: str) -> None:
        """The formats field shows the engine's defaults, unless what it holds was typed (not the last default)."""
        edit = self._lists["formats"]
        untouched = edit.text() in (self._defaults.get(self._shown_engine), LIST_FIELDS["formats"][1])
        if untouched and engine in self._defaults:
            edit.setText(self._defaults[engine])
        if engine in self._tips:
            edit.setToolTip(self._tips[engine])
        self._shown_engine = engine

    def _on_browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Model", self._model.text(), "GGUF (*.gguf);;All files (*)")
        if path:
            self._model.setText(path)
