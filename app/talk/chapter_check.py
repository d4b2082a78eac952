"""A chapter's claim as a check on its own measured figures, so that `inferlab prepare` says before the
talk when a result contradicts what the chapter says (pure functions: plain dicts in, plain dicts out).

A preset declares its claims under [compare] as a list of tables:

    [[compare.checks]]
    claim = "continuous batching serves the same requests faster than static batches"
    metric = "tokens_per_s"
    expect = "higher"                       # higher | lower: `config` against `than`
    config = "continuous, 4 at a time"      # configuration labels as the comparison shows them
    than = "static batches of 4"
    tolerance_pct = 0                       # optional slack, % of `than`'s figure

    expect = "rises" | "falls"              # over the measured configurations in order: every step the same
                                            # way (a series that rises and falls back is no rise), within
                                            # tolerance_pct of the step before
    expect = "at_least" | "at_most"         # `value`, for `config` (or every measured configuration)
    config = "first" | "last"               # the first / last measured configuration, whatever its label
                                            # (a fallback's values relabel them)

`evaluate_checks(checks, result)` gives one verdict per claim: holds True, False, or None when a figure
is missing or, for higher / lower over several rounds, when fewer than 3 in 4 of the rounds go the way
the medians go (the difference is inside this machine's run-to-run spread: too close to call, said so,
rather than a verdict that flips from one prepare to the next). `likely_reasons(result, conditions)` names
what on this machine may have broken a claim.
"""
from __future__ import annotations

from dataclasses import dataclass

EXPECTS = ("higher", "lower", "rises", "falls", "at_least", "at_most")
POSITIONS = ("first", "last")  # configuration names that stand for the first / last measured one


@dataclass(frozen=True, slots=True)
class CheckSpec:
    claim: str
    metric: str
    expect: str
    config: str | None = None
    than: str | None = None
    value: float | None = None
    tolerance_pct: float = 0.0


def parse_check(raw: dict, metrics: tuple[str, ...], labels: tuple[str, ...]) -> CheckSpec:
    """One [[compare.checks]] table; ValueError("key: message") names what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError("claim: expected a table")
    known = set(CheckSpec.__dataclass_fields__)
    for key in raw:
        if key not in known:
            raise ValueError(f"{key}: unknown key; expected one of {', '.join(CheckSpec.__dataclass_fields__)}")
    if not isinstance(raw.get("claim"), str) or not raw["claim"].strip():
        raise ValueError("claim: missing (a sentence the chapter says)")
    if raw.get("metric") not in metrics:
        raise ValueError(f"metric: expected one of this comparison's metrics ({', '.join(metrics)}), "
                         f"got {raw.get('metric')!r}")
    expect = raw.get("expect")
    if expect not in EXPECTS:
        raise ValueError(f"expect: expected one of {', '.join(EXPECTS)}, got {expect!r}")
    for key in ("config", "than"):
        if key in raw and raw[key] not in (*labels, *POSITIONS):
            raise ValueError(f"{key}: expected a configuration label ({'; '.join(labels)}), got {raw[key]!r}")
    if expect in ("higher", "lower") and not ("config" in raw and "than" in raw):
        raise ValueError(f"than: expect = {expect!r} needs config and than")
    value = raw.get("value")
    if expect in ("at_least", "at_most") and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"value: expect = {expect!r} needs a number, got {value!r}")
    tol = raw.get("tolerance_pct", 0.0)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol <= 100:
        raise ValueError(f"tolerance_pct: expected a number in [0, 100], got {tol!r}")
    return CheckSpec(raw["claim"].strip(), raw["metric"], expect, raw.get("config"), raw.get("than"),
                     None if value is None else float(value), float(tol))


def _measured(result: dict) -> list[dict]:
    return [r for r in result.get("comparison", []) if not r.get("computed")]


def _row(result: dict, label: str) -> dict | None:
    if label in POSITIONS:
        measured = _measured(result)
        return (measured[0] if label == "first" else measured[-1]) if measured else None
    return next((r for r in result.get("comparison", []) if label in (r["label"], r.get("spec_label"))), None)


def _figure(result: dict, label: str, metric: str) -> float | None:
    row = _row(result, label)
    return None if row is None else row["metrics"].get(metric)


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def evaluate_check(check: CheckSpec, result: dict) -> dict:
    """{"claim", "metric", "expect", "holds": True | False | None, "figures": the numbers it compared}, and
    for higher / lower the two configurations ("config", "than")."""
    m, slack = check.metric, check.tolerance_pct / 100.0
    holds, figures = None, "figures missing"
    if check.expect in ("higher", "lower"):
        a, b = _figure(result, check.config, m), _figure(result, check.than, m)
        if a is not None and b is not None:
            holds = a >= b * (1 - slack) if check.expect == "higher" else a <= b * (1 + slack)
            figures = f"{m}: {check.config} {_fmt(a)} vs {check.than} {_fmt(b)}"
            close = too_close(result, check, m)
            if close and not (slack and holds):  # a claim with slack ("holds there") stands within the noise
                holds, figures = None, f"{figures}: too close to call over its rounds ({close})"
    elif check.expect in ("rises", "falls"):
        rows = [(r["label"], r["metrics"].get(m)) for r in _measured(result)]
        values = [v for _label, v in rows if v is not None]
        if len(values) >= 2:
            holds = monotonic(values, check.expect, slack)
            figures = f"{m}: " + " → ".join(_fmt(v) for v in values)
    else:
        rows = [_row(result, check.config)] if check.config else _measured(result)
        values = [(r["label"], r["metrics"].get(m)) if r else (check.config, None) for r in rows]
        if values and all(v is not None for _label, v in values):
            ok = (lambda v: v >= check.value) if check.expect == "at_least" else (lambda v: v <= check.value)
            holds = all(ok(v) for _label, v in values)
            bound = "≥" if check.expect == "at_least" else "≤"
            figures = f"{m} {bound} {_fmt(check.value)}: " + ", ".join(f"{label} {_fmt(v)}" for label, v in values)
    verdict = {"claim": check.claim, "metric": m, "expect": check.expect, "holds": holds, "figures": figures}
    if check.expect in ("higher", "lower"):  # which two configurations (dearer_steps reads them)
        verdict.update(config=check.config, than=check.than)
    return verdict


def monotonic(values: list[float], expect: str, slack: float = 0.0) -> bool:
    """Every step of `values` goes the way `expect` says ("rises" / "falls"), each within `slack` of the
    step before (a flat step within the slack passes), and the last beyond the first."""
    sign = 1 if expect == "rises" else -1
    steps = all(sign * (b - a) > -slack * abs(a) for a, b in zip(values, values[1:]))
    return steps and sign * (values[-1] - values[0]) > slack * abs(values[0])


AGREEING_ROUNDS = 0.75  # of a multi-round comparison's rounds that must go the medians' way for a verdict


def too_close(result: dict, check: CheckSpec, metric: str) -> str | None:
    """For two configurations measured over several rounds (run in turn, A B A B ...: each round's pair
    close in time): None when at least AGREEING_ROUNDS of the rounds go the way the medians go (or there
    is one round); else how many went the claim's way, in words."""
    rounds = []
    for label in (check.config, check.than):
        values = ((_row(result, label) or {}).get("by_round") or {}).get(metric)
        if not isinstance(values, list) or len(values) < 2:
            return None
        rounds.append(values)
    pairs = list(zip(*rounds))
    higher = check.expect == "higher"
    claim_way = sum((a > b) if higher else (a < b) for a, b in pairs)
    a_med, b_med = _figure(result, check.config, metric), _figure(result, check.than, metric)
    medians_way = claim_way if ((a_med > b_med) if higher else (a_med < b_med)) else len(pairs) - claim_way
    if medians_way >= AGREEING_ROUNDS * len(pairs):
        return None
    return f"{claim_way} of {len(pairs)} rounds went the claim's way"


def evaluate_checks(checks, result: dict) -> list[dict]:
    return [evaluate_check(c, result) for c in checks]


def broken(verdicts: list[dict]) -> list[dict]:
    """The claims the figures contradict (a missing figure is not a contradiction, but is reported)."""
    return [v for v in verdicts if v["holds"] is False]


def likely_reasons(result: dict, conditions: dict) -> list[str]:
    """What on this machine may have broken a claim: a busy machine (the load average around the
    chapter against the CPUs left over), a dtype the CPU emulates, arrivals faster than the CPU serves.
    conditions: {"load_before": [1, 5, 15 min], "load_after": [...], "cpus": n, "threads": t,
    "dtype": "bfloat16", "native_bf16": bool}; any key may be missing."""
    reasons = []
    cpus, threads = conditions.get("cpus"), conditions.get("threads") or 1
    before, after = conditions.get("load_before"), conditions.get("load_after")
    if cpus and before and after:
        # the 1-minute load counts this run's own threads too: what is left beyond them is someone else's
        others = max(before[0], after[0] - threads)
        if others > max(cpus - threads, 0) + 0.5:
            reasons.append(f"a busy machine: load average {before[0]:.1f} before and {after[0]:.1f} after, on "
                           f"{cpus} CPUs with {threads} thread{'' if threads == 1 else 's'} of ours")
    if conditions.get("dtype") == "bfloat16" and conditions.get("native_bf16") is False:
        reasons.append("bf16 emulated: no native bf16 here (no AVX512-BF16/AMX, or INFERLAB_EMULATED_BF16), so "
                       "multi-row products compute in float32, widening every weight as they read it: each "
                       "extra row costs more than with bf16 dot products in hardware (and near ties can flip a "
                       "greedy token)")
    slow = too_slow_for_arrivals(result)
    if slow:
        reasons.append(slow)
    reasons.extend(dearer_steps(result))
    return reasons


def dearer_steps(result: dict) -> list[str]:
    """For each broken claim that one configuration serves more tokens/s than another: where its figures
    show it took fewer engine steps for the same requests, how much longer each of its steps took (wall
    time per step, from tokens/s and steps: the requests' tokens are the same). The scheduling or drafting
    saved steps; the CPU charged for the rows each step carried (batched requests, drafted tokens)."""
    lines = []
    for v in result.get("checks", []):
        if v.get("holds") is not False or v.get("metric") != "tokens_per_s" or v.get("expect") != "higher":
            continue
        a, b = v.get("config"), v.get("than")
        steps_a, steps_b = _figure(result, a, "steps"), _figure(result, b, "steps")
        tps_a, tps_b = _figure(result, a, "tokens_per_s"), _figure(result, b, "tokens_per_s")
        if not (steps_a and steps_b and tps_a and tps_b) or steps_a >= steps_b:
            continue
        per_step = (tps_b / tps_a) * (steps_b / steps_a)  # (wall_a / steps_a) / (wall_b / steps_b)
        lines.append(f"fewer steps, dearer steps: {a} took {100 * (1 - steps_a / steps_b):.0f} % fewer engine steps "
                     f"than {b} ({_fmt(steps_a)} vs {_fmt(steps_b)}) but each took {per_step:.2f}x as long: on this "
                     "CPU a step's time grows with the rows it carries (batched requests, drafted tokens)")
    return lines


def too_slow_for_arrivals(result: dict) -> str | None:
    """For Poisson/burst arrivals: the configuration whose measured tokens/s is below the tokens/s its
    arrivals ask for (rate x mean output tokens), if any."""
    wl = result.get("workload") or {}
    if wl.get("arrival") not in ("poisson", "burst"):
        return None
    out_lo, out_hi = wl.get("output_tokens") or (0, 0)
    for row in _measured(result):
        config = row.get("config", {})
        rate = config.get("rate_per_s", config.get("rate", wl.get("rate")))
        served = row["metrics"].get("tokens_per_s")
        if rate and served is not None:
            asked = rate * (out_lo + out_hi) / 2
            if served < 0.8 * asked:
                return (f"a CPU too slow for the arrival rate: at {row['label']} the requests ask for "
                        f"{_fmt(asked)} tok/s and it served {_fmt(served)} tok/s")
    return None
