"""Sweep results kept between runs, per machine and model (user data dir, JSON), and their CSV export."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from app.data_dir import data_root

CSV_FIELDS = ("batch", "bits", "draft", "tokens_per_s_user", "tokens_per_s_total", "usd_per_mtok",
              "ppl_delta_pct", "kl", "agreement", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms",
              "weights_bytes", "kv_blocks", "on_frontier", "predicted", "model", "device")


def store_dir() -> Path:
    return data_root() / "tradeoff"


def store_path(machine: str, model: str, base: Path | None = None) -> Path:
    """One file per machine and model; the model's full path is hashed in (two folders with the same
    name are different models)."""
    import hashlib

    digest = hashlib.sha1(model.encode()).hexdigest()[:10]
    key = f"{machine}__{Path(model).name or model}-{digest}"
    return (base or store_dir()) / ("".join(c if c.isalnum() or c in "-._" else "_" for c in key) + ".json")


def save(result: dict, machine: str, model: str, base: Path | None = None) -> Path:
    path = store_path(machine, model, base)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)  # a crash mid-write never loses the previous result
    return path


def load(machine: str, model: str, base: Path | None = None) -> dict | None:
    """The stored result, or None when there is none or it cannot be read."""
    path = store_path(machine, model, base)
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and isinstance(result.get("points"), list) else None


def export_csv(result: dict, path: str | Path, fields: tuple[str, ...] = CSV_FIELDS,
               lists: tuple[str, ...] = ("points", "predicted")) -> None:
    """One row per point of `lists` in that order: the explorer's measured points first, then the
    predicted ones (their "predicted" column says so); a tuning sweep's measured then failed points."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for name in lists:
            for p in result.get(name, []):
                writer.writerow({k: p.get(k) for k in fields})
