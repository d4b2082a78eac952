"""Sweep results kept between runs, per machine and model (user data dir, JSON), and their CSV export."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from app.data_dir import data_root
from app.json_shape import finite_number, list_of, whole
from engine.files import read_json

MAX_STORED_BYTES = 16 * 2**20  # a stored sweep: tens of points, kilobytes
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
        result = read_json(path, MAX_STORED_BYTES)
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and malformed(result) is None else None


_KEYS = ("batch", "bits", "draft")  # a point's configuration: whole numbers
_FIGURES = ("tokens_per_s_user", "tokens_per_s_total", "agreement", "kl", "usd_per_mtok",
            "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "weights_bytes", "kv_blocks",
            "kv_capacity_tokens", "group_size")


def _figure(v) -> bool:
    return v is None or (finite_number(v) and v >= 0)


def _point_problem(p, predicted_list: bool) -> str | None:
    if not isinstance(p, dict):
        return "a point that is not an object"
    if not all(whole(p.get(k)) for k in _KEYS):
        return f"a point whose {'/'.join(_KEYS)} are not whole numbers"
    if not all(k in p for k in ("tokens_per_s_user", "tokens_per_s_total")):
        return "a point without its tokens per second"
    delta = p.get("ppl_delta_pct")  # a change: below zero too
    if not all(_figure(p.get(k)) for k in _FIGURES) or not (delta is None or finite_number(delta)):
        return "a point whose figures are not finite numbers (of zero or more, but the perplexity change)"
    if not isinstance(p.get("predicted", False), bool):
        return "a point neither measured nor predicted"
    if predicted_list and p.get("predicted") and not all(isinstance(p.get(k), str) for k in ("model", "device")):
        return "a predicted point without its model and device"
    return None


def malformed(result: dict) -> str | None:
    """What is wrong with a stored sweep, or None where it has the shape app/tradeoff/sweep.py writes (every
    field the tradeoff panel reads, checked). A file edited or damaged into another shape counts as no
    stored sweep: in the panel it raised on every frame."""
    if "points" not in result:
        return "no points"
    for name in ("points", "predicted"):
        points = result.get(name, [])
        if not isinstance(points, list):
            return f"{name}: not a list"
        for p in points:
            if (why := _point_problem(p, name == "predicted")) is not None:
                return f"{name}: {why}"
    frontier = result.get("frontier", [])
    if not list_of(frontier, lambda f: isinstance(f, dict) and all(whole(f.get(k)) for k in _KEYS)):
        return "a frontier that is not a list of configurations"
    return None


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
