"""`inferlab bench serve --peer llama-server`: `inferlab serve` and llama.cpp's `llama-server` side by side.

Both servers run as child processes on the same GGUF (`--gguf`, default: the bf16 GGUF of --model's
weights, written once by llama.cpp's convert_hf_to_gguf.py), with the same threads, and are up for the
whole run. The HTTP serving bench (serve_url.py: seeded Poisson arrivals, streaming /v1/completions,
ignore_eos, temperature 0, latencies from each request's due time) sends the same schedule to each,
one server at a time: for every rate and round the two take turns, and the one that goes first
alternates from round to round, so both see the same drift of a shared machine. Medians over rounds.
Every rate and round has prompts of its own: a repeated text would be served from both servers' prefix
caches, and every round after the first would measure that instead of serving.

inferlab serve runs with its own defaults (`inferlab serve --threads T`: chunked prefill, FCFS, its
token budget and batch size), told the latency budget the run is judged by (`--ttft-budget-ms`,
`--tpot-budget-ms` from --slo-ttft and --slo-tpot: its scheduler serves toward it; --peer-no-budget leaves
it out), plus --peer-inferlab-args; llama-server with `-np` parallel slots (--peer-parallel) and continuous
batching (it has no such setting). Both command lines are in the JSON.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import statistics
import sys

from app.bench import llama_cpp
from app.bench.llama_server import ChildServer, enter_llama_server, free_port
from app.bench.serve_url import url_workload
from app.remote.http_load import client_for, make_text_schedule, run_rate, run_seed, warm_up
from engine.core.metrics import SLO

SIDES = ("inferlab", "llama.cpp")
# row fields compared, and which way is better
HIGHER_BETTER = ("goodput_rps", "slo_attainment", "output_tokens_per_s")
LOWER_BETTER = ("p50_ttft_s", "p99_ttft_s", "p50_tpot_s", "p99_tpot_s")


def add_peer_args(p) -> None:
    p.add_argument("--peer", choices=["llama-server"], default=None,
                   help="run inferlab serve and llama.cpp's llama-server on the same GGUF, side by side over HTTP")
    p.add_argument("--gguf", default=None, help="with --peer: the GGUF both serve (default: bf16 of --model's weights)")
    p.add_argument("--peer-parallel", type=int, default=8, help="with --peer: llama-server's slots (-np)")
    p.add_argument("--peer-threads", type=int, default=None,
                   help="with --peer: llama-server's threads (default: --threads, the same as inferlab's)")
    p.add_argument("--peer-ctx-per-slot", type=int, default=2048, help="with --peer: llama-server's context per slot")
    p.add_argument("--peer-inferlab-args", default="", help="with --peer: more `inferlab serve` options, one string")
    p.add_argument("--peer-no-budget", action="store_true",
                   help="with --peer: do not tell inferlab serve the SLO (--ttft-budget-ms / --tpot-budget-ms)")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --peer: rounds per rate (medians; who goes first alternates)")


def peer_gguf(args) -> str:
    if args.gguf:
        return args.gguf
    from engine.loading.loader import resolve_model_folder

    return str(llama_cpp.bf16_gguf(str(resolve_model_folder(args.model, lambda message, fraction: None))))


def inferlab_server(gguf: str, threads: int, extra: str, dtype: str, budget: SLO | None = None) -> ChildServer:
    """`inferlab serve` on `gguf`; with `budget`, told the SLO it is judged by."""
    port = free_port()
    told = [] if budget is None else ["--ttft-budget-ms", f"{budget.ttft_s * 1000:g}",
                                      "--tpot-budget-ms", f"{budget.tpot_s * 1000:g}"]
    return ChildServer("inferlab serve", [
        sys.executable, "-m", "app.cli", "serve", "--model", gguf, "--port", str(port), "--threads", str(threads),
        "--dtype", dtype, "--log-level", "warning", *told, *shlex.split(extra)], port)


def run_peer_bench(args) -> dict:
    binary = llama_cpp.find_binary("llama-server")
    if binary is None:
        raise ValueError(f"no llama-server under {llama_cpp.llama_cpp_dir()}: run scripts/build_llama_cpp.sh "
                         "(or set INFERLAB_LLAMA_CPP_DIR)")
    gguf = peer_gguf(args)
    threads = args.threads or 2
    slo = SLO(args.slo_ttft, args.slo_tpot, args.slo_percentile)
    schedules = {(rate, r): make_text_schedule(args, rate, run_seed(args.seed, i, r))
                 for i, rate in enumerate(args.rates) for r in range(args.rounds)}
    with contextlib.ExitStack() as stack:
        llama, note = enter_llama_server(stack, binary, gguf, args.peer_threads or threads, args.peer_parallel,
                                         args.peer_ctx_per_slot)
        servers = {"inferlab": stack.enter_context(inferlab_server(gguf, threads, args.peer_inferlab_args, args.dtype,
                                                                     None if args.peer_no_budget else slo)),
                   "llama.cpp": llama}
        commands = {name: " ".join(s.command) for name, s in servers.items()}
        runs = asyncio.run(_alternate(servers, schedules, args, slo))
    return {
        "driver": "HTTP, both servers up; the same seeded schedule sent to each in turn, fresh prompts every rate "
                  "and round (who goes first "
                  "alternates by round); streaming /v1/completions, ignore_eos, temperature 0; latency from the due "
                  "time, timed on arrival (client side)",
        "inferlab_told_slo": not args.peer_no_budget,
        "gguf": gguf, "threads": {"inferlab": threads, "llama.cpp": args.peer_threads or threads},
        "servers": commands, "llama_cpp_build": llama_cpp.llama_cpp_build(),
        **({"llama_cpp_note": note} if note else {}),
        "workload": {**url_workload(args, next(iter(schedules.values()))), "rounds": args.rounds},
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "percentile": slo.percentile},
        "runs": runs, **compare(runs, args.rates),
    }


async def _alternate(servers: dict[str, ChildServer], schedules: dict, args, slo: SLO) -> list[dict]:
    runs = []
    async with client_for(args.num_requests) as client:
        models = {name: await warm_up(client, s.url, None) for name, s in servers.items()}
        for rate in args.rates:
            for i in range(args.rounds):
                for name in (SIDES if i % 2 == 0 else SIDES[::-1]):
                    run = await run_rate(client, servers[name].url, models[name], rate, schedules[rate, i], slo,
                                         label=f"{name:<9}")
                    runs.append({"server": name, "round": i, "load_average_1m": os.getloadavg()[0], **run})
    return runs


def compare(runs: list[dict], rates: list[float]) -> dict:
    """Per rate: each side's median row over its rounds, and inferlab / llama.cpp for every figure."""
    table, ratios = [], []
    for rate in rates:
        med = {side: _median_row([r["row"] for r in runs if r["server"] == side and r["rate_rps"] == rate])
               for side in SIDES}
        table += [{"server": side, **med[side]} for side in SIDES]
        ratios.append({"rate_rps": rate, **{k: _ratio(med["inferlab"].get(k), med["llama.cpp"].get(k))
                                            for k in HIGHER_BETTER + LOWER_BETTER}})
    return {"table": table, "inferlab_over_llama_cpp": ratios,
            "ratio_note": "inferlab / llama.cpp: above 1 is better for goodput, SLO attainment and tokens/s; "
                          "below 1 is better for TTFT and TPOT"}


def _median_row(rows: list[dict]) -> dict:
    if not rows:
        return {}
    out = dict(rows[0])
    for key in HIGHER_BETTER + LOWER_BETTER + ("duration_s", "load_1m", "errors"):
        values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    out["rounds"] = len(rows)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 3)
