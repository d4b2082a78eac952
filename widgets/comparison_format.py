"""Text for the comparison panel: metric names as readable labels with their units, values, ratios.
Pure functions over plain values (the panel is fed plain dicts)."""
from __future__ import annotations

from widgets.fmt import human_bytes

_WORDS = {"p50": "p50", "p99": "p99", "ttft": "TTFT", "tpot": "TPOT", "itl": "inter-token gap", "e2e": "end-to-end",
          "kv": "KV", "slo": "SLO", "kl": "KL"}
# trailing words -> the unit they stand for
_UNIT_TAILS = ((("gb", "per", "s"), "GB/s"), (("tokens", "per", "s"), "tokens/s"), (("per", "s"), "/s"),
               (("rps",), "requests/s"), (("pct",), "%"), (("s",), "s"))


def metric_label(name: str) -> str:
    """'p99_ttft_ms' -> 'p99 TTFT (ms)'; 'tokens_per_s' -> 'tokens/s'; 'step_ms_median' -> 'step median (ms)'."""
    words = name.split("_")
    unit = ""
    if "ms" in words:
        words.remove("ms")
        unit = "ms"
    else:
        for tail, shown in _UNIT_TAILS:
            if tuple(words[-len(tail):]) == tail:
                if shown == "tokens/s":
                    return " ".join([*map(_word, words[:-3]), "tokens/s"])
                words, unit = words[: -len(tail)], shown
                break
    text = " ".join(_word(w) for w in words)
    if not text:
        return unit
    return f"{text} ({unit})" if unit else text


def _word(w: str) -> str:
    return _WORDS.get(w, w)


def is_predicted(name: str) -> bool:
    return "predicted" in name


def format_value(name: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if "bytes" in name.split("_"):
        return human_bytes(value)
    if name.endswith("_pct"):
        return f"{value:.1f} %"
    a = abs(value)
    if float(value).is_integer() and a < 1e15:  # counts (blocks, tokens, requests) stay whole
        return f"{int(value):,}"
    if a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 0.01 or a == 0:
        return f"{value:.2f}"
    return f"{value:.2g}"


def metric_unit(name: str) -> str:
    """The unit a metric is counted in ("bytes", "tokens/s", "ms", "%", ...; "" for a plain number)."""
    words = name.split("_")
    if "bytes" in words:
        return "bytes"
    label = metric_label(name)
    if label.endswith("tokens/s"):
        return "tokens/s"
    return label[label.rfind("(") + 1 : -1] if label.endswith(")") else ""


def mixed_units(names: list[str]) -> bool:
    return len({metric_unit(m) for m in names}) > 1


def value_with_unit(name: str, value: float | None) -> str:
    """A bar's number with its unit, for charts that put metrics of different units side by side."""
    text = format_value(name, value)
    unit = metric_unit(name)
    if value is None or unit in ("bytes", "%", ""):  # bytes and % carry theirs already
        return text if unit or value is None else f"{text} {metric_label(name)}"
    return f"{text} {unit}"


def ratio_text(value: float | None, first: float | None) -> str:
    """'3.1x' vs the first configuration ('' when either is missing or zero)."""
    if value is None or not first:
        return ""
    r = value / first
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x"


def measured_line(result: dict) -> str:
    """'measured 2026-11-30 15:40 UTC on Intel Xeon, 2 threads, torch 2.13' (date and machine of the run;
    ', medians of 3 rounds in turn' where the configurations ran alternately)."""
    when = str(result.get("measured_at", "?")).replace("T", " ")[:16]
    m = result.get("machine") or {}
    name = m.get("gpu") or m.get("cpu") or "unknown machine"
    suffix = " UTC" if str(result.get("measured_at", "")).endswith(("+00:00", "Z")) else ""
    threads = m.get("threads", "?")
    plural = "" if threads == 1 else "s"
    rounds = result.get("rounds")
    medians = f", medians of {rounds} rounds in turn" if isinstance(rounds, int) and rounds > 1 else ""
    return f"measured {when}{suffix} on {name}, {threads} thread{plural}, torch {m.get('torch', '?')}{medians}"


def numeric_knob_values(result: dict) -> list[float] | None:
    """The knob's values when the comparison is a curve: one numeric knob, more than two values."""
    knob, rows = result.get("knob"), result.get("comparison", [])
    values = [r.get("config", {}).get(knob) for r in rows]
    if not knob or len(values) <= 2 or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        return None
    return [float(v) for v in values]


def check_flag(result: dict) -> tuple[str, str]:
    """The chapter check's word on the panel (app/talk/compare/prepare_chapter.py writes "checks"), short
    enough for a projector, and its full text for the tooltip: each claim the figures contradict, the
    likely reasons (their names on screen, the figures in the tooltip), a fallback measured instead.
    ("", "") when every claim holds or none was checked. A stored result that is not what the last
    `inferlab prepare` wrote ("store_note", app/talk/compare/profile.py) says so first."""
    broken = [v for v in result.get("checks", []) if v.get("holds") is False]
    note = [result["store_note"]] if isinstance(result.get("store_note"), str) else []
    close = [v for v in result.get("checks", []) if v.get("holds") is None and "too close" in str(v.get("figures"))]
    short = note + [f"⚠ not so here: {v['claim']} ({v['figures']})" for v in broken]
    short += [f"≈ too close to call here: {v['claim']} ({v['figures'].rpartition('(')[2].rstrip(')')})"
              for v in close]  # the rounds disagreed: no verdict, said
    full = list(short)
    reasons = result.get("check_reasons") or ["no reason found on this machine"]
    if broken:
        short.append("likely: " + "; ".join(r.split(":", 1)[0] for r in reasons))
        full += [f"likely: {r}" for r in reasons]
    fallback = result.get("fallback")
    if fallback:
        short.append(f"measured at the preset's fallback: {fallback.get('reason')}")
        first = [v["claim"] for v in fallback.get("first_try", []) if v.get("holds") is False]
        full.append(short[-1] + (f" (the first try contradicted: {'; '.join(first)})" if first else ""))
    return "\n".join(short), "\n".join(full)


def _pair(result: dict, name: str, rows: list[dict]) -> tuple[dict, dict]:
    """The two configurations the headline compares: those of the chapter's first claim on the headline
    metric (config vs than), else the last measured against the first."""
    def find(label):
        return next((r for r in rows if label in (r.get("label"), r.get("spec_label"))), None)
    for check in result.get("checks", []):
        if check.get("metric") == name and check.get("config") and check.get("than"):
            a, b = find(check["config"]), find(check["than"])
            if a is not None and b is not None and a is not b:
                return a, b
    return rows[-1], rows[0]


def headline_line(result: dict) -> str:
    """The chapter's number in one line: its headline metric for the two configurations it is about, with
    their ratio ("decode tokens/s: max_num_seqs = 8 61.2 vs max_num_seqs = 1 21.0 (2.91x)")."""
    metrics = result.get("metrics") or []
    name = result.get("headline") if result.get("headline") in metrics else (metrics[0] if metrics else None)
    rows = [r for r in result.get("comparison", []) if name and r["metrics"].get(name) is not None]
    if not rows:
        return ""
    if len(rows) == 1:
        return f"{metric_label(name)}: {rows[0]['label']} {value_with_unit(name, rows[0]['metrics'][name])}"
    a, b = _pair(result, name, rows)
    va, vb = a["metrics"][name], b["metrics"][name]
    ratio = ratio_text(va, vb)
    return (f"{metric_label(name)}: {a['label']} {format_value(name, va)} vs {b['label']} "
            f"{format_value(name, vb)}" + (f" ({ratio})" if ratio else ""))
