"""Presets: one TOML file per idea of the talk (presets/*.toml), validated with file:line:key errors; their
order, the talk's, is presets/talk.toml (app/talk/talk_order.py).

    [preset]    title, caption, panels = [names of the panels to emphasise]
    [engine]    scheduling knobs (max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, policy),
                num_kv_blocks (the KV cache size: the engine is rebuilt in the background), and knobs
                of features that may not exist yet (quant_bits, num_speculative_tokens, spec_method,
                compile, max_loras): the app says when one is not available
    [workload]  arrival_rate, burst, prompt_tokens / output_tokens / burst_prompt_tokens /
                burst_output_tokens = [lo, hi], shared_prefix_tokens, temperature, ignore_eos, autostart,
                lora_mix = [adapter names, "base"] (each request runs with one, drawn uniformly; the
                adapters are found by name: engine/lora/shipped.py), instructions (prompts are chat
                instructions instead of windows of text)
    [budget]    ttft_ms, tpot_ms
    [cues]      every_s, and [[cues.at]] tables (at_s, burst, set = {knob = value}, note): the chapter's
                moment on a timeline (app/talk/cues.py); optional
    [compare]   the chapter's measured comparison (app/talk/compare/spec.py: knob + values or [[compare.configs]],
                workload, metrics); optional

Missing keys take the defaults below, so a preset describes a whole state, whatever ran before it.
tomllib reports no line numbers for values, so errors find the key's line in the text.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from app.load.generator import LoadConfig
from app.talk.compare.spec import CompareSpec, CompareSpecError, parse_compare
from app.talk.compare.toml_lines import compare_line
from app.talk.cues import Cue, parse_cues
from app.talk.panel_specs import PANEL_NAMES
from app.talk.preset_error import PresetError
from app.talk.talk_order import TALK_FILE, load_talk, preset_files
from engine.events import SpecMethod
from engine.files import UnreadableFile, parse_toml, read_text, shown
from engine.knobs import KNOB

PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"




# --- value checks: each returns the value or raises ValueError("expected …") ---------------------
def _int(lo: int, hi: int | None = None) -> Callable:
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise ValueError(f"expected an integer {rng}")
        return v
    return check


def _number(lo: float, strict: bool = False) -> Callable:
    def check(v):
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        if not ok or v < lo or (strict and v == lo):
            raise ValueError(f"expected a number {'>' if strict else '>='} {lo:g}")
        return float(v)
    return check


def _bool(v):
    if not isinstance(v, bool):
        raise ValueError("expected true or false")
    return v


def _text(v):
    if not isinstance(v, str) or not v.strip():
        raise ValueError("expected a non-empty string")
    return v.strip()


def _knob(name: str) -> Callable:
    knob = KNOB[name]

    def check(v):
        why = knob.problem(v, app=True)
        if why:
            raise ValueError(why)
        return v
    return check


def _range(v):
    if (not isinstance(v, list) or len(v) != 2 or any(isinstance(x, bool) or not isinstance(x, int) for x in v)
            or not 1 <= v[0] <= v[1]):
        raise ValueError("expected [lo, hi], integers with 1 <= lo <= hi")
    return (v[0], v[1])


def _adapter_names(v):
    if not isinstance(v, list) or not v or any(not isinstance(n, str) or not re.fullmatch(r"[\w.-]+", n) for n in v):
        raise ValueError("expected a list of adapter names (letters, digits, '_', '.', '-'; 'base': the base model)")
    return tuple(v)


def _panels(v):
    if not isinstance(v, list) or any(p not in PANEL_NAMES for p in v):
        raise ValueError(f"expected a list of panel names from {', '.join(PANEL_NAMES)}")
    return tuple(v)


LOAD_FIELDS = frozenset(f.name for f in fields(LoadConfig))  # the [workload] keys that go to the load generator
SCHEMA: dict[str, dict[str, tuple[Callable, object]]] = {  # section -> key -> (check, default)
    "preset": {"title": (_text, None), "caption": (_text, None), "panels": (_panels, ())},
    "engine": {  # checked against the engine's knob table (engine/knobs.py), in the ranges the app offers
        **{name: (_knob(name), KNOB[name].default) for name in (
            "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "policy", "quant_bits",
            "num_speculative_tokens", "spec_method", "compile", "max_loras",
            "num_kv_blocks")},  # num_kv_blocks None: what the app started with; else a reload
        "quant_group_size": (_knob("quant_group_size"), None),  # None: the engine's own
    },
    "workload": {
        "arrival_rate": (_number(0.0), 2.0), "burst": (_int(0, 256), 0), "burst_size": (_int(1, 256), 16),
        "prompt_tokens": (_range, (32, 256)), "output_tokens": (_range, (16, 128)),
        "burst_prompt_tokens": (_range, (512, 1024)), "burst_output_tokens": (_range, (16, 64)),
        "shared_prefix_tokens": (_int(0, 8192), 0), "temperature": (_number(0.0), 0.8), "ignore_eos": (_bool, False),
        "autostart": (_bool, True), "lora_mix": (_adapter_names, ()), "instructions": (_bool, False),
    },
    "budget": {"ttft_ms": (_number(0.0, strict=True), 1000.0), "tpot_ms": (_number(0.0, strict=True), 100.0)},
}
REQUIRED = {("preset", "title"), ("preset", "caption")}
# engine keys of features that are not part of the scheduler: (capability name, "not available" text)
FEATURES = {
    "quant_bits": ("quantization", "weight quantization arrives with issue 5; this runs with 16-bit weights"),
    "quant_group_size": ("quantization", "weight quantization arrives with issue 5; this runs with 16-bit weights"),
    "num_speculative_tokens": ("speculative", "speculative decoding arrives with issue 4; this runs without it"),
    "spec_method": ("speculative", "speculative decoding arrives with issue 4; this runs without it"),
    "max_loras": ("lora", "multi-LoRA serving (an adapter pool) is not offered by this engine source; every "
                          "request uses the base model"),
}
RELOAD_KEYS = ("num_kv_blocks",)  # fixed when the engine is built: changing one rebuilds it
FEATURE_OFF = {"quant_bits": 16, "quant_group_size": None, "num_speculative_tokens": 0, "spec_method": None,
               "max_loras": 0}


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    path: str
    title: str
    caption: str
    panels: tuple[str, ...] = ()
    engine: dict = field(default_factory=dict)  # every [engine] key, defaults filled in
    load: LoadConfig = field(default_factory=LoadConfig)
    burst: int = 0
    burst_size: int = 16
    autostart: bool = True
    ttft_s: float = 1.0
    tpot_s: float = 0.1
    cues: tuple[Cue, ...] = ()  # the [cues] section: scripted moments (app/talk/cues.py)
    cue_period_s: float = 0.0  # the cue timeline repeats every this many seconds (0: once)
    compare: CompareSpec | None = None  # the [compare] section, when the preset has one

    def scheduling(self) -> dict:
        """The knobs the running engine can change (EngineConfig fields, reconfigure())."""
        return {k: v for k, v in self.engine.items() if k not in FEATURES and k not in RELOAD_KEYS}

    def unavailable(self, capabilities) -> list[str]:
        """One sentence per feature this preset asks for that the engine does not have."""
        out = []
        for key, (cap, why) in FEATURES.items():
            if self.engine.get(key) != FEATURE_OFF[key] and cap not in capabilities and why not in out:
                out.append(why)
        if self.engine["spec_method"] == SpecMethod.MTP and "mtp" not in capabilities and "speculative" in capabilities:
            out.append("this model has no multi-token prediction heads yet: train them with `inferlab train-mtp` "
                       "(a few minutes on the CPU) and open this preset again; until then it runs without "
                       "speculation (the n-gram and draft-model proposers need no training: see 'speculative')")
        return out


def key_line(text: str, section: str, key: str | None) -> int | None:
    """1-based line of `key = ` inside `[section]` (or of the section header when key is None)."""
    current = None
    for i, line in enumerate(text.splitlines(), 1):
        s = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"\[\[?\s*([A-Za-z0-9_.-]+)\s*\]\]?", s)
        if m:
            current = m.group(1)
            if current == (section if key is None else f"{section}.{key}"):
                return i  # the section's header, or a sub-table [section.key]
            continue
        if current == section and key is not None and re.match(rf"^{re.escape(key)}\s*=", s):
            return i
    return None


def resolve(name_or_path: str, presets_dir: Path = PRESETS_DIR) -> Path:
    """A preset name (looked up in presets/) or a path to a .toml file."""
    p = Path(name_or_path).expanduser()
    if p.suffix == ".toml" or p.is_file() or "/" in name_or_path:
        return p
    return presets_dir / f"{name_or_path}.toml"


def available(presets_dir: Path = PRESETS_DIR) -> list[str]:
    """The presets in the talk's order (presets/talk.toml: app/talk/talk_order.py), then any other preset file
    of the folder; PresetError when talk.toml lies."""
    return list(load_talk(presets_dir).names)


def load_preset(name_or_path: str | Path, presets_dir: Path = PRESETS_DIR) -> Preset:
    path = resolve(str(name_or_path), presets_dir)
    if path.name == TALK_FILE and path.parent.resolve() == presets_dir.resolve():
        raise PresetError(path, None, "", "this is the talk's order (its [[chapter]] tables), not a preset")
    try:  # a regular file of at most MAX_TEXT_BYTES, nested at most MAX_DEPTH (engine/files.py)
        text = read_text(path)
        data = parse_toml(path, text)
    except FileNotFoundError as exc:
        known = ", ".join(preset_files(presets_dir))
        raise PresetError(path, None, "", f"cannot read preset ({exc.strerror or exc}); presets: {known}") from exc
    except UnreadableFile as exc:
        raise PresetError(path, exc.line, "", exc.why) from None
    values = _validate(path, text, data)
    p, e, w, b = values["preset"], values["engine"], values["workload"], values["budget"]
    load = LoadConfig(**{k: v for k, v in w.items() if k in LOAD_FIELDS})  # a [workload] row named as LoadConfig's
    return Preset(name=path.stem, path=str(path), title=p["title"], caption=p["caption"], panels=p["panels"],
                  engine=e, load=load, burst=w["burst"], burst_size=w["burst_size"], autostart=w["autostart"],
                  ttft_s=b["ttft_ms"] / 1e3, tpot_s=b["tpot_ms"] / 1e3, compare=_compare(path, text, data),
                  **_cues(path, text, data))


def _cues(path: Path, text: str, data: dict) -> dict:
    table = data.get("cues", {})
    if not isinstance(table, dict):
        raise PresetError(path, key_line(text, "cues", None), "[cues]", "expected a table")
    try:
        cues, period = parse_cues(table)
    except ValueError as exc:
        key = str(exc).split(":", 1)[0].split(".", 1)[0]
        line = key_line(text, "cues", key) or key_line(text, "cues.at", key) or key_line(text, "cues", None)
        raise PresetError(path, line, "[cues]", str(exc)) from None
    return {"cues": cues, "cue_period_s": period}


def _compare(path: Path, text: str, data: dict) -> CompareSpec | None:
    if "compare" not in data:
        return None
    try:
        return parse_compare(data["compare"])
    except CompareSpecError as exc:
        where = f"[{exc.table}] {exc.key}" if exc.key else f"[{exc.table}]"
        raise PresetError(path, compare_line(text, exc.table, exc.key), where, exc.message) from None


def _validate(path: Path, text: str, data: dict) -> dict[str, dict]:
    for section in data:
        if section not in SCHEMA and section not in ("cues", "compare"):  # each has its own parser
            raise PresetError(path, key_line(text, section, None), f"[{section}]",
                              "unknown section; expected one of "
                              + ", ".join(f"[{s}]" for s in (*SCHEMA, "compare", "cues")))
    out: dict[str, dict] = {}
    for section, keys in SCHEMA.items():
        given = data.get(section, {})
        if not isinstance(given, dict):
            raise PresetError(path, key_line(text, section, None), f"[{section}]", "expected a table")
        for key in given:
            if key not in keys:
                raise PresetError(path, key_line(text, section, key), f"[{section}] {key}",
                                  f"unknown key; expected one of {', '.join(keys)}")
        out[section] = {}
        for key, (check, default) in keys.items():
            if key not in given:
                if (section, key) in REQUIRED:
                    raise PresetError(path, key_line(text, section, None), f"[{section}] {key}", "missing")
                out[section][key] = default
                continue
            try:
                out[section][key] = check(given[key])
            except ValueError as exc:
                raise PresetError(path, key_line(text, section, key), f"[{section}] {key}",
                                  f"{exc}, got {_show(given[key])}") from None
    return out


def _show(v) -> str:
    if isinstance(v, str):
        return f'"{shown(v)[1:-1]}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    return shown(v)
