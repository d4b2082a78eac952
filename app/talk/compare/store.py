"""Stored comparison results, per machine, model and configuration (JSON in the user data dir).

    <user data dir>/inferlab/comparisons/<machine key>/<model key>/<preset>.json

Each file holds one preset's result as run_comparison returns it:
    {"title", "knob", "metrics": [names], "chart": [names], "metric_info": {name: text}, "workload",
     "fingerprint", "machine": {...}, "measured_at": ISO time, "model", "comparison": [{"label", "config":
     {knob: value}, "metrics": {name: number}, "computed"?: true, "note"?}], "not_built"?: text,
     and from `prepare`: "checks": [{"claim", "metric", "expect", "holds", "figures"}], "conditions",
     "check_reasons"?, "fallback"? / "fallback_tried"? (app/talk/compare/prepare_chapter.py)}
The fingerprint hashes the preset's [compare] section: a result of an older version of the section is
not shown as the current one. `prepare --json` gathers them as
    {"machine", "model", "presets": {NAME: {"measured_at", "comparison": [...]}, ...}}.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from app.data_dir import data_root
from app.talk.compare.machine import machine_key

SUBDIR = "comparisons"


def store_root() -> Path:
    return data_root() / SUBDIR


def model_key(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", Path(str(model)).name or str(model)).strip("-").lower()


def result_path(preset_name: str, model: str, machine: dict, root: Path | None = None) -> Path:
    return (root or store_root()) / machine_key(machine) / model_key(model) / f"{preset_name}.json"


def save_result(preset_name: str, model: str, result: dict, root: Path | None = None) -> Path:
    """Write one preset's result (atomically: a crash never leaves half a file)."""
    path = result_path(preset_name, model, result["machine"], root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**result, "model": model}, indent=1), encoding="utf-8")
    tmp.replace(path)
    return path


def load_stored(preset_name: str, model: str, machine: dict | None = None, *, fingerprint: str | None = None,
                root: Path | None = None) -> dict | None:
    """The stored result of a preset for this model and machine (default: this machine), or None when
    there is none, it cannot be read, or its fingerprint differs from `fingerprint` (when given)."""
    if machine is None:
        from app.talk.compare.machine import machine_info

        machine = machine_info()
    path = result_path(preset_name, model, machine, root)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "comparison" not in data:
        return None
    if fingerprint is not None and data.get("fingerprint") != fingerprint:
        return None
    return data


def prepared_json(model: str, machine: dict, results: dict[str, dict]) -> dict:
    """The `inferlab prepare --json` document."""
    keep = ("title", "measured_at", "comparison", "metrics", "chart", "knob", "metric_info", "fingerprint",
            "not_built", "checks", "check_reasons", "conditions", "fallback", "fallback_tried", "workload", "capacity")
    presets = {name: {k: r[k] for k in keep if k in r}
               for name, r in results.items()}
    return {"machine": machine, "model": model, "presets": presets}
