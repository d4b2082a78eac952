"""A tuning sweep's CSV and PNG, as the explorer exports its own (issue 13): the CSV through the sweep
store's writer, the PNG as the tradeoff panel draws it (speed per user against cost, the frontier, the
chosen point ringed), rendered off screen."""
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
    """The frontier plot of `result` as a PNG (a QApplication is made when there is none)."""
    from PySide6.QtWidgets import QApplication

    from widgets.tradeoff import TradeoffPanel, sweep_label

    app = QApplication.instance() or QApplication([])
    panel = TradeoffPanel()
    panel.resize(*size)
    panel.set_price_per_hour(result["price_per_hour"])
    panel.set_sweep({"points": result["points"], "frontier": result["frontier"]})
    chosen = next((p for p in result["points"] if result.get("chosen") and p["label"] == result["chosen"]["label"]),
                  None)
    panel.set_current(sweep_label(chosen) if chosen else None)
    panel.show()
    app.processEvents()  # one layout pass so the plot has its final size before it is drawn and grabbed
    panel.flush()
    saved = panel.export_png(str(path))
    panel.close()
    return saved
