"""Export what the window shows: a Chrome trace, each panel as PNG, panel data and history as CSV."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from app.gui.panels import Panels
from app.gui.trace_recorder import TraceRecorder


def export_pngs(panels: Panels, window, folder: str | Path) -> list[Path]:
    """window.png and one <panel>.png per panel (its current picture, whatever its size)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, widget in (("window", window), *panels.items()):
        if hasattr(widget, "flush"):
            widget.flush()
        path = folder / f"{name}.png"
        if widget.grab().save(str(path)):
            written.append(path)
    return written


def flatten(data, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts and lists -> (dotted key, value) rows."""
    rows: list[tuple[str, str]] = []
    if isinstance(data, dict):
        for k, v in data.items():
            rows.extend(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(data, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in data):
        for i, v in enumerate(data):
            rows.extend(flatten(v, f"{prefix}[{i}]"))
    else:
        rows.append((prefix, json.dumps(data) if isinstance(data, (list, tuple)) else str(data)))
    return rows


def export_csv(panels: Panels, recorder: TraceRecorder, folder: str | Path) -> list[Path]:
    """steps.csv and requests.csv (the run's history) and panels.csv (every panel's snapshot_data)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    steps, requests, panel_file = folder / "steps.csv", folder / "requests.csv", folder / "panels.csv"
    recorder.write_steps_csv(steps)
    recorder.write_requests_csv(requests)
    with open(panel_file, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(("panel", "key", "value"))
        for name, panel in panels.items():
            for key, value in flatten(panel.snapshot_data()):
                w.writerow((name, key, value))
    return [steps, requests, panel_file]
