"""One chapter in `inferlab prepare`: run its comparison, check the chapter's claims on the figures it
measured (app/talk/chapter_check.py), and when a claim breaks and the preset declares a fallback (a lower
arrival rate, fewer streams), run that once and keep whichever result breaks fewer claims. The result
says all of it: "checks" (one verdict per claim), "conditions" (load average before and after, CPUs,
threads, the dtype and whether this CPU computes it natively), "check_reasons" (the likely reasons for a
broken claim) and "fallback" (what was retried, and the first try's verdicts)."""
from __future__ import annotations

import os
from collections.abc import Callable

from app.talk.chapter_check import broken, evaluate_checks, likely_reasons


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # not on every platform
        return None


def dtype_conditions(dtype: str, device: str) -> dict:
    """The dtype the comparison engines compute in ("auto" is bf16, engine/runner/setup.py) and, on a
    CPU, whether the engine computes bf16 natively: the CPU's bf16 instructions, unless
    INFERLAB_EMULATED_BF16 tells the engine to ignore them (engine/runner/cpu_compute.py decides both)."""
    import torch

    from engine.kernels import cpu_flags
    from engine.runner.cpu_compute import emulated_bf16_forced, native_bf16_flags

    name = "bfloat16" if dtype == "auto" else dtype
    native = None
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if name == "bfloat16" and on_cpu:
        flags = list(cpu_flags())
        native = (bool(native_bf16_flags(flags)) and not emulated_bf16_forced()) if flags else None
    return {"dtype": name, "native_bf16": native}


def run_checked(preset, run: Callable[[object], dict], base_conditions: dict,
                say: Callable[[str], None]) -> dict:
    """run(compare_spec) -> result. Returns the result to store, with its checks and conditions."""
    spec = preset.compare
    result = run_with_checks(spec, run, base_conditions)
    verdicts = result["checks"]
    if broken(verdicts) and spec.fallback is not None:
        say(f"{preset.name}: {len(broken(verdicts))} claim(s) broken; trying the fallback once: "
            f"{spec.fallback_reason}")
        retry = run_with_checks(spec.fallback, run, base_conditions, checks=spec.checks)
        if len(broken(retry["checks"])) < len(broken(verdicts)):
            retry["fallback"] = {"reason": spec.fallback_reason, "first_try": verdicts,
                                 "first_try_reasons": result.get("check_reasons", [])}
            retry["fingerprint"] = result["fingerprint"]  # the app looks the chapter's result up by this
            say(f"{preset.name}: the fallback holds {len(verdicts) - len(broken(retry['checks']))} of "
                f"{len(verdicts)} claims: stored")
            result = retry
        else:
            result["fallback_tried"] = {"reason": spec.fallback_reason, "checks": retry["checks"]}
            say(f"{preset.name}: the fallback breaks as many claims: the first result is stored")
    return result


def run_with_checks(spec, run, base_conditions: dict, checks=None) -> dict:
    """run(spec) with the load average around it, and the claims checked on its figures."""
    before = load_average()
    result = run(spec)
    conditions = {**base_conditions, "load_before": before, "load_after": load_average(), "cpus": os.cpu_count()}
    result["conditions"] = conditions
    result["checks"] = evaluate_checks(spec.checks if checks is None else checks, result)
    if broken(result["checks"]):
        result["check_reasons"] = likely_reasons(result, conditions)
    return result


def check_lines(result: dict) -> list[str]:
    """prepare's lines for a result's checks: one per broken or unverifiable claim, then the reasons."""
    lines = []
    for v in result.get("checks", []):
        if v["holds"] is False:
            lines.append(f"  CONTRADICTS ITS CHAPTER: {v['claim']} ({v['figures']})")
        elif v["holds"] is None:
            lines.append(f"  not checked: {v['claim']} ({v['figures']})")
    if any(v["holds"] is False for v in result.get("checks", [])):
        reasons = result.get("check_reasons") or ["no likely reason found on this machine"]
        lines += [f"  likely: {r}" for r in reasons]
    held = sum(v["holds"] is True for v in result.get("checks", []))
    if result.get("checks"):
        lines.append(f"  checks: {held} of {len(result['checks'])} claims hold")
    return lines
