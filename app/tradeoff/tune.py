"""The tuning sweep on a real server (`inferlab tune`): one managed server per configuration point.

For each point: `ManagedServer.start` (a point that will not start is a failed point with the reason and
the server's log tail; the sweep goes on), a warm-up request, then the explorer's measurements through
HTTP: the seeded load generator at each rate (streaming /v1/completions, temperature 0, ignore_eos;
latencies from each request's due time), the server process's memory, its own /metrics, and greedy
agreement with the bf16 point of the same model on held-out prompts. A server that dies mid-measurement
is a failed point too, and so is one still running when the sweep is cancelled, its --point-timeout or
the sweep's --time-limit runs out (a watchdog thread stops its server: a server that streams for ever
cannot hold the sweep). Every read from the server is bounded in size and time (app/remote/bounded.py).
Frontier, CSV and PNG as the explorer's (issue 13).

Public entry: `run_tune(spec: TuneSpec, progress=None, on_point=None, cancelled=None) -> dict`.

The result (plain JSON; `inferlab tune --json OUT` writes it):

    {
      "engine": "llama-server",              # ENGINES name
      "engine_source": "common/arg.cpp ...",  # where the flags' spelling was read, with the version
      "executable": "/path/to/llama-server",
      "model": {"name": str, "by_format": {"bf16": path, "q8_0": path, "q4_1": path}, "draft": path | None,
                "draft_note": "the smallest GGUF of the same model (same vocabulary)"},
      "flag_table": [{"knob": "batch", "flag": "-np", "meaning": "..."}, ...],
      "points": [                            # measured points, in sweep order
        {"engine", "model", "label",          # label: "batch 4, Q8_0, draft 4" (ServerPoint.label)
         "batch", "weight_format", "weight_label",   # the format's name and label (app/managed/formats.py)
         "kv_dtype", "draft", "chunked_prefill", "prefix_caching",
         "flags": "-m ... -np 4 ...",         # the command line after the executable
         "command": "llama-server -m ...",    # shlex.join of the exact command line that ran
         "tokens_per_s_user",                 # 1 / p50 TPOT at the highest rate
         "tokens_per_s_total",                # output tokens / run wall time at the highest rate
         "usd_per_mtok",                      # price_per_hour / (tokens_per_s_total * 3600) * 1e6
         "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "goodput_rps", "slo_attainment",
         "runs": [row per rate: rate_rps, goodput_rps, slo_attainment, p50/p99 ttft/tpot (s),
                  output_tokens_per_s, duration_s, errors, load_1m],
         "repeat_runs": [rows of the highest rate's further runs (--repeats)], "repeats": int,
         "spread": {"tokens_per_s_user", "tokens_per_s_total", "usd_per_mtok": [least, most]},  # repeats > 1
                                              # (the figures above are the median run's)
         "rss_bytes": int | None,             # = memory.rss_bytes (a CSV column)
         "memory": {"rss_bytes": int | None,  # VmRSS of the server process (/proc/PID/status), measured
                    "rss_peak_bytes": int | None,   # VmHWM
                    "server_metrics": {family: value}},  # what the server's own /metrics says
         "draft_acceptance": float | None,    # accepted / proposed draft tokens, from the server's counters
         "agreement": float | None,           # greedy agreement with the bf16 point (see "quality")
         "agreement_positions": int, "agreement_unit": "tokens" | "text characters" | None,
         "greedy": [[tokens, unit] per held-out prompt], "served_model": str, "errors": int,
         "kl": None, "ppl_delta_pct": None,   # only where the server returns prompt logprobs
         "on_frontier": bool, "predicted": false, "failed": false, "seconds": float}
      ],
      "failed": [{"engine", "model", "label", "batch", "weight_format", "weight_label", "kv_dtype", "draft",
                  "chunked_prefill",
                  "prefix_caching", "flags", "command", "failed": true, "stage": "start" | "measure",
                  "reason": str, "log_tail": str, "seconds": float}],
      "not_run": [label, ...],               # points left when the time limit was reached (or cancelled)
      "frontier": [{"batch", "weight_format", "draft", "kv_dtype", "label"}],  # speed per user vs cost
      "frontier_with_quality": [...],                                         # ... and agreement
      "chosen": {"label", "command", "why", "context"?, "context_said"?} | None,   # llama-server: the
                                             # context a slot holds, said (-c is shared by the -np slots)
      "quality": {"method": str, "reference": label | None, "prompts": int, "max_tokens": int,
                  "perplexity_kl": str},     # e.g. "not returned by llama-server"
      "workload": {...}, "slo": {"ttft_s", "tpot_s", "percentile"}, "price_per_hour": float,
      "threads": int | None,
      "measured_at": iso time, "wall_seconds": float, "stopped_early": str | None
    }
"""
from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import httpx

from app.managed.formats import REFERENCE, SERVER_FORMAT_BY_NAME, SERVER_FORMATS
from app.managed.server import ManagedServer, PointFailed
from app.managed.table import FlagError, ServedModel, ServerEngine, ServerPoint
from app.managed.watchdog import Watchdog
from app.remote.bounded import ReadLimit
from app.tradeoff.frontier import cheapness, pareto, speed
from app.tradeoff.tune_measure import (
    TuneLoad,
    agreement,
    draft_acceptance,
    headline,
    measure_server,
    process_memory,
    server_metrics,
)
from engine.core.metrics import SLO

USER_PORT = 8080  # the port in the command line of a point that never ran (a measured one shows its own)
PROMPT_LOGPROBS = {"llama-server": "not returned by llama-server (no prompt logprobs in its API)"}
QUALITY_METHOD = ("greedy agreement: the held-out prompts at temperature 0, ignore_eos, a fixed number of tokens "
                  "each, one request at a time; the tokens each point returned compared position by position "
                  "with the bf16 point's (text characters where the server lists no tokens)")
Progress = Callable[[str, float], None]


@dataclass(frozen=True, slots=True)
class TuneSpec:
    engine: ServerEngine
    exe: str
    model: ServedModel
    points: tuple[ServerPoint, ...]
    load: TuneLoad = field(default_factory=TuneLoad)
    slo: SLO = field(default_factory=lambda: SLO(2.0, 0.2))
    price_per_hour: float = 2.50
    threads: int | None = None
    time_limit_s: float | None = None
    start_timeout_s: float = 300.0
    draft_note: str = ""
    point_timeout_s: float | None = 1800.0  # one point, start to stop (a server that streams for ever)
    port: int | None = None  # the servers' port (None: a free one per point)
    # llama-server's context per slot: {"per_slot", "longest_request_tokens", "given"} (tune_cli.sized_engine)
    context: dict | None = None


def sweep_order(points: tuple[ServerPoint, ...]) -> list[ServerPoint]:
    """bf16 points first (the first of them, with the fewest drafts, is the quality reference), then by bytes
    per weight and name (two formats of one width apart), draft and batch (each file read into the cache once)."""
    width = {f.name: f.bits_per_weight for f in SERVER_FORMATS}
    return sorted(points, key=lambda p: (p.weight_format != REFERENCE, -width.get(p.weight_format, 0), p.weight_format,
                                         p.draft, p.batch, str(p.kv_dtype)))


def identity(spec: TuneSpec, point: ServerPoint) -> dict:
    fmt = SERVER_FORMAT_BY_NAME.get(point.weight_format)
    return {"engine": spec.engine.name, "model": spec.model.name, "label": point.label(), "batch": point.batch,
            "weight_format": point.weight_format, "weight_label": fmt.label if fmt else point.weight_format,
            "kv_dtype": point.kv_dtype, "draft": point.draft,
            "chunked_prefill": point.chunked_prefill, "prefix_caching": point.prefix_caching}


def planned_command(spec: TuneSpec, point: ServerPoint) -> list[str]:
    try:
        return spec.engine.argv(spec.exe, spec.model, point, spec.port or USER_PORT, spec.threads)
    except FlagError:
        return []


def _failed(spec: TuneSpec, point: ServerPoint, argv: list[str], stage: str, reason: str, log_tail: str,
            seconds: float) -> dict:
    return {**identity(spec, point), "flags": shlex.join(argv[1:]), "command": shlex.join(argv), "failed": True,
            "stage": stage, "reason": reason, "log_tail": log_tail, "seconds": round(seconds, 2)}


# What a hostile or broken server can make a measurement raise; the point is recorded failed, the sweep goes on.
MEASURE_ERRORS = (httpx.HTTPError, ReadLimit, RuntimeError, ValueError, LookupError, TypeError, OSError)


def run_point(spec: TuneSpec, point: ServerPoint, reference: list | None, say: Callable[[str], None],
              deadline: float | None = None, cancelled: Callable[[], bool] = lambda: False) -> dict:
    """One point, start to stop: its measured dict, or a failed one (start or measurement); the server is
    stopped at `deadline` or when `cancelled()` (the point is then failed with that reason)."""
    t0 = time.perf_counter()
    server = ManagedServer(spec.engine, spec.exe, spec.model, point, spec.threads, spec.start_timeout_s, spec.port)
    watchdog = Watchdog(server, deadline, cancelled)
    try:
        return _start_and_measure(spec, point, reference, say, server, watchdog, t0)
    finally:  # whatever happens (an interrupt too), no server is left running
        watchdog.close()
        server.stop()


def _start_and_measure(spec: TuneSpec, point: ServerPoint, reference: list | None, say: Callable[[str], None],
                       server: ManagedServer, watchdog: Watchdog, t0: float) -> dict:
    say("starting the server")
    try:
        server.start()
    except PointFailed as exc:
        return _failed(spec, point, planned_command(spec, point), "start", watchdog.reason or str(exc),
                       exc.log_tail, time.perf_counter() - t0)
    argv = server.command
    try:
        say(f"measuring: {spec.load.num_requests} requests at {', '.join(map(str, spec.load.rates))} req/s, "
            f"then {spec.load.quality_prompts} greedy prompts")
        measured = measure_server(server.url, spec.load, spec.slo, point.label(), ready_s=spec.start_timeout_s,
                                  gone=lambda: "the server was stopped" if watchdog.reason else
                                  None if server.alive() else f"{spec.engine.name} exited ({server.exit_code()})")
        memory = {**process_memory(server.pid), "server_metrics": server_metrics(server.url)}
        if not server.alive():
            raise RuntimeError("the server is gone")
    except MEASURE_ERRORS as exc:
        reason = f"{type(exc).__name__}: {exc}"[:300]
        if watchdog.reason:
            reason = f"{watchdog.reason} ({reason})"
        elif not server.alive():  # the request's error is the symptom; the server's exit is the cause
            reason = f"{spec.engine.name} exited ({server.exit_code()}) during the measurement ({reason})"
        return _failed(spec, point, argv, "measure", reason, server.log_tail(), time.perf_counter() - t0)
    if watchdog.reason:  # stopped mid-way: what was measured is not this point's figure
        return _failed(spec, point, argv, "measure", watchdog.reason, server.log_tail(), time.perf_counter() - t0)
    errors = sum(run["row"]["errors"] for run in measured["runs"] + measured.get("repeats", []))
    quality = (agreement(reference, measured["greedy"]) if reference is not None
               else {"agreement": None, "agreement_positions": 0, "agreement_unit": None})
    return {**identity(spec, point), "flags": shlex.join(argv[1:]), "command": shlex.join(argv),
            **headline(measured["runs"], spec.price_per_hour, measured.get("repeats", [])), "errors": errors,
            "runs": [run["row"] for run in measured["runs"]],
            "repeat_runs": [run["row"] for run in measured.get("repeats", [])], "memory": memory,
            "rss_bytes": memory["rss_bytes"],
            "draft_acceptance": draft_acceptance(memory["server_metrics"]), **quality,
            "greedy": measured["greedy"], "kl": None, "ppl_delta_pct": None, "served_model": measured["served_model"],
            "on_frontier": False, "predicted": False, "failed": False, "seconds": round(time.perf_counter() - t0, 2),
            **({"note": server.note} if server.note else {})}


def point_deadline(spec: TuneSpec, sweep_t0: float) -> float | None:
    """When the point starting now must be stopped: its --point-timeout, and the sweep's --time-limit."""
    ends = [sweep_t0 + spec.time_limit_s] if spec.time_limit_s is not None else []
    if spec.point_timeout_s is not None:
        ends.append(time.perf_counter() + spec.point_timeout_s)
    return min(ends, default=None)


def run_tune(spec: TuneSpec, progress: Progress | None = None, on_point: Callable[[dict], None] | None = None,
             cancelled: Callable[[], bool] = lambda: False) -> dict:
    """Every point of `spec`, one managed server each; returns the result described at the top."""
    report = progress or (lambda text, fraction: None)
    order = sweep_order(spec.points)
    points, failed, not_run, reference, ref_label, stopped = [], [], [], None, None, None
    t0 = time.perf_counter()
    for i, point in enumerate(order):
        elapsed = time.perf_counter() - t0
        if stopped is None and cancelled():
            stopped = "cancelled"
        if stopped is None and spec.time_limit_s is not None and elapsed >= spec.time_limit_s:
            stopped = f"time limit of {spec.time_limit_s:.0f} s reached after {elapsed:.0f} s"
        if stopped is not None:
            not_run.append(point.label())
            continue
        head, done = f"point {i + 1}/{len(order)} ({point.label()})", i / len(order)
        result = run_point(spec, point, reference, lambda text, head=head, done=done: report(f"{head}: {text}", done),
                           point_deadline(spec, t0), cancelled)
        if result["failed"]:
            failed.append(result)
            report(f"{head}: FAILED at {result['stage']}: {result['reason'][:160]}", (i + 1) / len(order))
        else:
            if reference is None and point.weight_format == REFERENCE:
                reference, ref_label = result["greedy"], result["label"]
                result.update(agreement(reference, reference))
            points.append(result)
            report(f"{head}: {result['tokens_per_s_total']} tok/s total, {result['tokens_per_s_user']:.1f} "
                   f"tok/s per user" if result["tokens_per_s_user"] else f"{head}: measured", (i + 1) / len(order))
        if on_point is not None:
            on_point(result)
    return assemble(spec, points, failed, not_run, ref_label, stopped, time.perf_counter() - t0)


CHOSEN_MIN_AGREEMENT = 0.9  # the chosen point keeps at least this greedy agreement with the bf16 point
FRONTIER_KEYS = ("batch", "weight_format", "draft", "kv_dtype", "label")


def kept_quality(p: dict) -> float:
    return p["agreement"] if p.get("agreement") is not None else float("-inf")


def choose(points: list[dict], frontier: list[int]) -> dict | None:
    """The cheapest point of the speed/cost frontier that keeps CHOSEN_MIN_AGREEMENT (else the cheapest)."""
    if not frontier:
        return None
    good = [i for i in frontier if kept_quality(points[i]) >= CHOSEN_MIN_AGREEMENT]
    pick = min(good or frontier, key=lambda i: points[i]["usd_per_mtok"])
    why = (f"the cheapest $/1M tokens on the speed/cost frontier with greedy agreement >= {CHOSEN_MIN_AGREEMENT}"
           if good else f"the cheapest $/1M tokens on the speed/cost frontier (none of its points keeps greedy "
                         f"agreement >= {CHOSEN_MIN_AGREEMENT})")
    return {"label": points[pick]["label"], "command": points[pick]["command"], "why": why}


def with_context(chosen: dict | None, spec: TuneSpec, points: list[dict]) -> dict | None:
    """The chosen command's context, said: each slot holds the longest request it serves (llama-server's
    -c is shared by its -np slots, so -np 4 -c 1024 serves requests of 256 tokens at most)."""
    if chosen is None or spec.context is None:
        return chosen
    batch = next(p["batch"] for p in points if p["label"] == chosen["label"])
    ctx, longest = spec.context["per_slot"], spec.context["longest_request_tokens"]
    said = (f"-np {batch} -c {batch * ctx}: {ctx} tokens a slot, the longest request (prompt + answer) this "
            f"command serves; the sweep's longest was about {longest} tokens")
    if not spec.context.get("given"):
        said += "; for longer requests run the sweep with --ctx-per-slot (your workload's longest request)"
    return {**chosen, "context": {**spec.context, "total": batch * ctx}, "context_said": said}


def assemble(spec: TuneSpec, points: list[dict], failed: list[dict], not_run: list[str], ref_label: str | None,
             stopped: str | None, seconds: float) -> dict:
    usable = [i for i, p in enumerate(points) if p["usd_per_mtok"] is not None]
    sub = [points[i] for i in usable]
    two = [usable[i] for i in pareto(sub, (speed, cheapness))]
    three = [usable[i] for i in pareto(sub, (speed, cheapness, kept_quality))]
    for i, p in enumerate(points):
        p["on_frontier"] = i in two
    keys = lambda idx: [{k: points[i][k] for k in FRONTIER_KEYS} for i in idx]  # noqa: E731
    engine = spec.engine
    return {
        "engine": engine.name, "engine_source": engine.source, "executable": spec.exe,
        "model": {"name": spec.model.name, "by_format": dict(spec.model.by_format),
                  "draft": spec.model.draft, "draft_note": spec.draft_note},
        "flag_table": [{"knob": r.knob, "flag": r.flag, "meaning": r.meaning} for r in engine.rows],
        "points": points, "failed": failed, "not_run": not_run,
        "frontier": keys(two), "frontier_with_quality": keys(three), "chosen": with_context(choose(points, two), spec,
                                                                                             points),
        "quality": {"method": QUALITY_METHOD, "reference": ref_label, "prompts": spec.load.quality_prompts,
                    "max_tokens": spec.load.quality_tokens,
                    "perplexity_kl": PROMPT_LOGPROBS.get(engine.name, "not measured: the sweep asks no server "
                                                                      "for prompt logprobs")},
        "workload": spec.load.as_dict(),
        "slo": {"ttft_s": spec.slo.ttft_s, "tpot_s": spec.slo.tpot_s, "percentile": spec.slo.percentile},
        "price_per_hour": spec.price_per_hour, "threads": spec.threads,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_seconds": round(seconds, 1), "stopped_early": stopped,
    }
