"""`inferlab tune --png`: a tuning sweep's points as the tradeoff panel draws them in the app (speed per
user against cost, the frontier, the chosen point ringed with its command line under the plot), rendered
off screen. Here, with the Qt code, so the sweep (app/tradeoff/tune_cli.py) runs without Qt: app/cli.py
hands this writer to it."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QApplication

from widgets.tradeoff import TradeoffPanel
from widgets.tradeoff_points import server_label


def write_png(result: dict, path: str | Path, size: tuple[int, int] = (900, 620)) -> bool:
    """The frontier plot of `result` as a PNG (a QApplication is made when there is none: on Qt's offscreen
    platform, which needs no display; on a machine without one the default platform aborted the process)."""
    app = QApplication.instance() or QApplication(["inferlab-tune", "-platform", "offscreen"])
    panel = TradeoffPanel()
    panel.resize(*size)
    panel.set_price_per_hour(result["price_per_hour"])
    engine, model = result["engine"], result["model"]["name"]  # as the app labels them: engine · model · point
    panel.set_server_sweep(engine, model, result["points"], [f["label"] for f in result["frontier"]])
    if result.get("chosen"):  # ringed, its command line under the plot
        panel.select_point(server_label(engine, model, result["chosen"]["label"]))
    panel.show()
    app.processEvents()  # one layout pass so the plot has its final size before it is drawn and grabbed
    panel.flush()
    saved = panel.export_png(str(path))
    panel.close()
    return saved
