"""The main window's menus and keyboard shortcuts (File, View, Presets, Load)."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QFileDialog

from app.gui import exporters
from app.talk.talk_order import load_talk_or_files


def build_menus(window) -> dict[str, QAction]:
    actions: dict[str, QAction] = {}
    ctl = window.controller
    bar = window.menuBar()

    def add(menu, name: str, text: str, slot, shortcut: str | None = None, checkable: bool = False) -> QAction:
        action = QAction(text, window)
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
        action.setCheckable(checkable)
        action.triggered.connect(slot)
        menu.addAction(action)
        actions[name] = action
        return action

    file = bar.addMenu("&File")
    add(file, "attach", "Attach to server…", lambda: attach_dialog(window))
    add(file, "tune", "Tune a server…", lambda: window.tuning.open(), "Ctrl+T")
    file.addSeparator()
    add(file, "export-trace", "Export Chrome trace JSON…", lambda: export_trace(window))
    add(file, "export-png", "Export plots PNG…", lambda: export_png(window))
    add(file, "export-csv", "Export CSV…", lambda: export_csv(window))
    file.addSeparator()
    add(file, "quit", "Quit", window.close, "Ctrl+Q")

    view = bar.addMenu("&View")
    themes = QActionGroup(window)
    for name in ("dark", "light"):
        a = add(view, f"theme-{name}", f"{name.title()} theme", lambda _c=False, n=name: window.set_theme(n),
                checkable=True)
        a.setChecked(window.theme == name)
        themes.addAction(a)
    view.addSeparator()
    add(view, "presenter", "Presenter mode", lambda on: window.set_presenter(on), "F11", checkable=True)
    add(view, "reset-layout", "Reset layout", window.reset_layout)
    view.addSeparator()
    panels = view.addMenu("Panels")
    for dock in window.docks.values():
        panels.addAction(dock.toggleViewAction())

    menu = bar.addMenu("&Presets")
    add(menu, "preset-next", "Next preset", lambda: ctl.step_preset(+1), "PgDown")
    add(menu, "preset-prev", "Previous preset", lambda: ctl.step_preset(-1), "PgUp")
    add(menu, "preset-open", "Open preset file…", lambda: open_preset(window))
    menu.addSeparator()
    talk = load_talk_or_files(ctl.presets_dir, window.show_message)  # the talk's order (presets/talk.toml)
    for number, name in enumerate(talk.names, 1):
        title = talk.titles.get(name)
        add(menu, f"preset:{name}", f"{number}. {name}" + (f" — {title}" if title else ""),
            lambda _c=False, n=name: ctl.apply_preset(n))

    load = bar.addMenu("&Load")
    add(load, "load-toggle", "Start / stop load", ctl.toggle_load, "Space")
    add(load, "burst", "Burst of long prompts", lambda: ctl.burst(), "B")
    add(load, "next-cue", "Next cue of the preset", ctl.next_cue, "N")
    add(load, "reset", "Reset", ctl.reset, "R")
    load.addSeparator()
    add(load, "chunked", "Chunked prefill", lambda on: ctl.set_chunked_prefill(on), "C", checkable=True)
    add(load, "compile", "torch.compile the dense layers", lambda on: ctl.set_compiled(on), "K", checkable=True)
    add(load, "sweep", "Run tradeoff sweep (explorer)", lambda: ctl.run_sweep(), "S")
    add(load, "compare", "Measure this chapter's comparison", lambda: ctl.measure_comparison(), "M")
    add(load, "prepare", "Prepare the talk: measure every preset's comparison",
        lambda: ctl.measure_comparison(every_preset=True))
    load.addSeparator()
    add(load, "serve", "Serve OpenAI API on 127.0.0.1:8000", lambda on: window.toggle_server(on), checkable=True)
    return actions


def _ask_file(window, title: str, default: str, filt: str) -> str:
    path, _ = QFileDialog.getSaveFileName(window, title, str(Path.home() / default), filt)
    return path


def _ask_folder(window, title: str) -> str:
    return QFileDialog.getExistingDirectory(window, title, str(Path.home()))


def export_trace(window, path: str | None = None) -> str | None:
    path = path or _ask_file(window, "Export Chrome trace", "inferlab-trace.json", "JSON (*.json)")
    if path:
        window.recorder.write_chrome_trace(path)
        window.show_message(f"trace written to {path} ({window.recorder.num_steps} steps, "
                            f"{window.recorder.num_requests} requests; open it in ui.perfetto.dev)")
    return path or None


def export_png(window, folder: str | None = None) -> str | None:
    folder = folder or _ask_folder(window, "Export plots as PNG into…")
    if folder:
        window.flush_panels()
        written = exporters.export_pngs(window.panels, window, folder)
        window.show_message(f"{len(written)} PNG files written to {folder}")
    return folder or None


def export_csv(window, folder: str | None = None) -> str | None:
    folder = folder or _ask_folder(window, "Export CSV into…")
    if folder:
        window.flush_panels()
        written = exporters.export_csv(window.panels, window.recorder, folder)
        window.show_message(f"{', '.join(p.name for p in written)} written to {folder}")
    return folder or None


def open_preset(window) -> None:
    path, _ = QFileDialog.getOpenFileName(window, "Open preset", str(window.controller.presets_dir), "TOML (*.toml)")
    if path:
        window.controller.apply_preset(path)


def attach_dialog(window) -> None:
    """Ask for a server's URL (and API key), then open a window attached to it; this one keeps its source."""
    from PySide6.QtWidgets import QInputDialog, QLineEdit

    url, ok = QInputDialog.getText(window, "Attach to server", "OpenAI-compatible server URL (vLLM, SGLang, "
                                   "llama-server, inferlab serve):", text="http://127.0.0.1:8000")
    if not ok or not url.strip():
        return
    key, ok = QInputDialog.getText(window, "Attach to server", "API key (empty: none):", QLineEdit.EchoMode.Password)
    if not ok:
        return
    window.attach(url.strip(), key.strip() or None)
