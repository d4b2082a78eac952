"""Stored comparison results, per machine, model and configuration (JSON in the user data dir).

    <data dir>/comparisons/<machine key>/<model key>/<preset>.json                  (no profile)
    <data dir>/profiles/<profile>/comparisons/<machine key>/<model key>/<preset>.json  (--profile NAME)

(the data dir and profiles: app/talk/compare/profile.py; `prepare` records what it wrote in prepared.json
beside the results.)

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

from app.json_shape import finite_number, list_of, text_or_none
from app.talk.compare.machine import machine_key
from app.talk.compare.profile import profile_root
from engine.files import read_json

SUBDIR = "comparisons"
MAX_STORED_BYTES = 16 * 2**20  # a stored comparison: a few configurations' figures, kilobytes


def store_root() -> Path:
    return profile_root() / SUBDIR


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
        data = read_json(path, MAX_STORED_BYTES)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "comparison" not in data or malformed(data):
        return None
    if fingerprint is not None and data.get("fingerprint") != fingerprint:
        return None
    return data


def _checks_ok(v) -> bool:
    return list_of(v, lambda c: isinstance(c, dict) and isinstance(c.get("holds", False), (bool, type(None)))
                    and all(isinstance(c.get(k, ""), str) for k in ("claim", "metric", "expect", "figures")))


def _arm_problem(arm) -> str | None:
    if not isinstance(arm, dict):
        return "a configuration that is not an object"
    if not isinstance(arm.get("label"), str):
        return "a configuration without a text label"
    metrics = arm.get("metrics")
    if not isinstance(metrics, dict) or not all(isinstance(k, str) and finite_number(v) for k, v in metrics.items()):
        return f"{arm['label']!r}: metrics that are not finite numbers"
    if not isinstance(arm.get("config", {}), dict) or not text_or_none(arm.get("note")):
        return f"{arm['label']!r}: a config or note of the wrong kind"
    if not isinstance(arm.get("computed", False), bool):
        return f"{arm['label']!r}: 'computed' not true or false"
    requests = arm.get("requests", [])
    if not list_of(requests, lambda r: isinstance(r, dict) and all(
            finite_number(r.get(k, 0.0)) for k in ("queue_ms", "prefill_ms", "decode_ms"))):
        return f"{arm['label']!r}: request timings that are not finite numbers"
    return None


def malformed(data: dict) -> str | None:
    """What is wrong with a stored result, or None where it has the shape `run_comparison` and `prepare`
    write (the comparison panel reads every field named here). A file edited or damaged into another shape
    counts as no stored result: the panel says none is stored, and M measures it again, instead of the
    preset failing half applied."""
    rows = data.get("comparison")
    if not isinstance(rows, list) or not (rows or isinstance(data.get("not_built"), str)):
        return "no list of configurations"
    for arm in rows:
        if (why := _arm_problem(arm)) is not None:
            return why
    machine = data.get("machine", {})
    if not isinstance(machine, dict) or not all(text_or_none(machine.get(k)) for k in ("cpu", "gpu")):
        return "a machine of the wrong kind"
    if not isinstance(machine.get("threads", 1), (int, str)):
        return "a thread count of the wrong kind"
    info = data.get("metric_info", {})
    if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
        return "metric descriptions of the wrong kind"
    text_lists = [data.get(k, []) for k in ("metrics", "chart", "check_reasons")]
    if not all(list_of(v, lambda x: isinstance(x, str)) for v in text_lists):
        return "metric or reason lists that are not texts"
    if not all(text_or_none(data.get(k)) for k in ("title", "knob", "measured_at", "not_built", "headline", "regime")):
        return "a title, knob, time or note of the wrong kind"
    if not isinstance(data.get("rounds", 1), int) or not _checks_ok(data.get("checks", [])):
        return "rounds or checks of the wrong kind"
    fallback = data.get("fallback")
    if fallback is not None and not (isinstance(fallback, dict) and _checks_ok(fallback.get("first_try", []))
                                     and text_or_none(fallback.get("reason"))):
        return "a fallback of the wrong kind"
    return None


def prepared_json(model: str, machine: dict, results: dict[str, dict]) -> dict:
    """The `inferlab prepare --json` document."""
    keep = ("title", "measured_at", "comparison", "metrics", "chart", "knob", "metric_info", "fingerprint",
            "not_built", "checks", "check_reasons", "conditions", "fallback", "fallback_tried", "workload", "capacity",
            "headline", "knee", "regime")
    presets = {name: {k: r[k] for k in keep if k in r}
               for name, r in results.items()}
    return {"machine": machine, "model": model, "presets": presets}
