"""A tuning sweep's CSV and PNG, as the explorer exports its own (issue 13): the CSV through the sweep
store's writer, the PNG as the tradeoff panel draws it in the app (speed per user against cost, the
frontier, the chosen point ringed with its command line under the plot), rendered off screen."""
from __future__ import annotations

from pathlib import Path

from app.tradeoff.sweep_store import export_csv

TUNE_CSV_FIELDS = ("engine", "model", "label", "batch", "bits", "kv_dtype", "draft", "chunked_prefill",
                   "prefix_caching", "tokens_per_s_user", "tokens_per_s_total", "usd_per_mtok", "p50_ttft_ms",
                   "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "goodput_rps", "slo_attainment", "agreement",
                   "rss_bytes", "on_frontier", "failed", "stage", "reason", "command")


def write_csv(result: dict, path: str | Path) -> None:
    """Measured points, then the failed ones (with the reason), one row each."""
    export_csv(result, path, TUNE_CSV_FIELDS, ("points", "failed"))


def write_png(result: dict, path: str | Path, size: tuple[int, int] = (900, 620)) -> bool:
    """The frontier plot of `result` as a PNG (a QApplication is made when there is none: on Qt's offscreen
    platform, which needs no display; on a machine without one the default platform aborted the process)."""
    from PySide6.QtWidgets import QApplication

    from widgets.tradeoff import TradeoffPanel
    from widgets.tradeoff_points import server_label

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
