"""A tuning sweep's CSV, as the explorer exports its own (issue 13), through the sweep store's writer. Its
PNG is drawn by the tradeoff panel, so it lives with the Qt code: app/gui/tune_png.py."""
from __future__ import annotations

from pathlib import Path

from app.tradeoff.sweep_store import export_csv

TUNE_CSV_FIELDS = ("engine", "model", "label", "batch", "weight_format", "kv_dtype", "draft", "chunked_prefill",
                   "prefix_caching", "tokens_per_s_user", "tokens_per_s_total", "usd_per_mtok", "p50_ttft_ms",
                   "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "goodput_rps", "slo_attainment", "agreement",
                   "rss_bytes", "on_frontier", "failed", "stage", "reason", "command")


def write_csv(result: dict, path: str | Path) -> None:
    """Measured points, then the failed ones (with the reason), one row each."""
    export_csv(result, path, TUNE_CSV_FIELDS, ("points", "failed"))
