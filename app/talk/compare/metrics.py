"""RunRecord -> {metric name: number}. Latency maths from engine/core/metrics.py; every figure here is
measured from the run's own step events, except the names with "predicted" (a bandwidth model)."""
from __future__ import annotations

import statistics

from app.talk.compare.collect import RunRecord
from engine.core.metrics import SLO, latency_report, percentile, request_timings


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3


def _phase_rate(steps, tokens_of, only) -> float | None:
    chosen = [s for s in steps if only(s)]
    secs = sum(s.wall_time_s for s in chosen)
    return sum(tokens_of(s) for s in chosen) / secs if secs > 0 else None


def run_metrics(rec: RunRecord, slo: SLO | None, num_output_tokens: int) -> dict[str, float | None]:
    """Timing and scheduling metrics of one run."""
    wall = max(rec.t_end - rec.t_start, 1e-9)
    timings = [request_timings(t) for t in rec.timelines]
    rep = latency_report(timings, wall, slo)
    steps = rec.steps
    busy = [s for s in steps if s.num_tokens]
    decode_only = [s for s in busy if s.num_decode_tokens and not s.num_prefill_tokens and not s.num_verify_tokens]
    tpots = [t.tpot_s for t in timings if t.tpot_s]
    computed = sum(s.num_tokens for s in busy)
    m = {
        "tokens_per_s": num_output_tokens / wall,
        "per_user_tokens_per_s": statistics.median(1 / t for t in tpots) if tpots else None,
        "prefill_tokens_per_s": _phase_rate(busy, lambda s: s.num_prefill_tokens,
                                            lambda s: s.num_prefill_tokens and not s.num_decode_tokens),
        "decode_tokens_per_s": _phase_rate(decode_only, lambda s: s.num_decode_tokens, lambda s: True),
        "step_ms_median": _ms(percentile([s.wall_time_s for s in busy], 50)),
        "decode_step_ms_median": _ms(percentile([s.wall_time_s for s in decode_only], 50)),
        "p50_ttft_ms": _ms(rep.ttft["p50"]), "p99_ttft_ms": _ms(rep.ttft["p99"]),
        "p50_e2e_ms": _ms(rep.e2e["p50"]), "p99_e2e_ms": _ms(rep.e2e["p99"]),
        "p50_tpot_ms": _ms(rep.tpot["p50"]), "p99_tpot_ms": _ms(rep.tpot["p99"]), "p50_queue_ms": _ms(rep.queue["p50"]),
        "p99_itl_ms": _ms(percentile(rec.itl, 99)) if rec.itl else None,
        "max_itl_ms": _ms(max(rec.itl)) if rec.itl else None,
        "p50_prefill_ms": _ms(rep.prefill["p50"]), "p50_decode_ms": _ms(rep.decode["p50"]),
        "goodput_rps": rep.goodput_rps if slo else None,
        "slo_attainment_pct": 100 * rep.slo_attainment if slo else None,
        "kv_blocks_peak": max((s.kv_blocks_used for s in steps), default=0),
        "kv_blocks": steps[-1].kv_blocks_total if steps else None,
        "preemptions": sum(s.num_preempted for s in steps),
        "tokens_computed_per_output_token": computed / num_output_tokens if num_output_tokens else None,
        "held_back_chars_max": rec.held_back_max,
        "outputs_with_held_back": rec.outputs_with_held_back,
        "wall_s": wall,
    }
    if rec.spec_drafted:
        m["acceptance_rate_pct"] = 100 * rec.spec_accepted / rec.spec_drafted
        m["tokens_per_verify"] = rec.spec_emitted / rec.spec_passes if rec.spec_passes else None
    return m


def bandwidth_metrics(rec: RunRecord, weights_read_bytes: int, probe_bytes_per_s: float | None) -> dict:
    """Decode steps read every weight once and the batch's KV cache: bytes per step from the sizes,
    the bandwidth that step time implies, and the ceiling the probe bandwidth predicts."""
    steps = [s for s in rec.steps if s.num_decode_tokens and not s.num_prefill_tokens and not s.num_verify_tokens]
    if not steps or not rec.decode_kv_tokens:
        return {}
    kv_tokens = statistics.median(rec.decode_kv_tokens)
    per_step = weights_read_bytes + kv_tokens * rec.kv_bytes_per_token
    step_s = statistics.median(s.wall_time_s for s in steps)
    rows = statistics.median(s.num_decode_tokens for s in steps)
    out = {"bytes_per_decode_step": per_step, "achieved_gb_per_s": per_step / step_s / 1e9}
    if probe_bytes_per_s:
        out["probe_gb_per_s"] = probe_bytes_per_s / 1e9
        out["predicted_decode_tokens_per_s"] = rows * probe_bytes_per_s / per_step
    return out


def request_split(rec: RunRecord) -> list[dict]:
    """Each request's time split into queue / prefill / decode (ms), in arrival order."""
    out = []
    for t in sorted((request_timings(tl) for tl in rec.timelines), key=lambda t: int(t.request_id.rsplit("-", 1)[1])):
        out.append({"id": t.request_id, "queue_ms": _ms(t.queue_s), "prefill_ms": _ms(t.prefill_s),
                    "decode_ms": _ms(t.decode_s)})
    return out
