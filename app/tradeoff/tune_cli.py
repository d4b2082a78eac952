"""`inferlab tune --engine E --model M ...`: the tuning sweep on a real server, from the command line.

The parser's options and what they become (TuneSpec); app/cli.py only adds the subcommand (and --png's
drawing, which needs Qt: app/gui/tune_png.py). Weight formats are named (app/managed/formats.py). What the
server loads per format and where its executable is: app/managed/setup.py (`--manage` uses the same rules). A
bad engine, a missing executable or a model that cannot be found is one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from collections.abc import Callable

from app.managed.engines import ENGINES
from app.managed.formats import default_formats, formats_for, parse_formats
from app.managed.setup import SetupError, find_executable, served_model
from app.managed.table import ServerEngine, ServerPoint
from app.tradeoff.tune_measure import TuneLoad
from engine.config import DEFAULT_MODEL
from engine.core.metrics import SLO


def add_tune_args(p) -> None:
    p.add_argument("--engine", required=True, help="the server to tune: " + ", ".join(ENGINES))
    p.add_argument("--model", default=DEFAULT_MODEL, help="built-in name, Hugging Face folder or .gguf file")
    p.add_argument("--gguf-dir", default=None, help="llama-server: a folder of GGUFs, each the format its file "
                   "type says (else its name: *bf16*, *f16*, *q8_0*, *q4_1*, *q4_k_m*, *q4_0*); the smallest one "
                   "is the draft")
    p.add_argument("--weights", action="append", default=[], metavar="FORMAT=PATH",
                   help="what the server loads for the weight format FORMAT, e.g. q4_0=/models/m-q4_0.gguf or "
                        "awq=org/m-awq (repeatable; overrides the defaults)")
    p.add_argument("--server-bin", default=None, help="the server's executable (default: looked up)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8], help="requests decoded at once (server slots)")
    p.add_argument("--formats", nargs="+", default=None, metavar="FORMAT",
                   help="weight formats by name, e.g. bf16,q8_0,q4_1 (llama-server: " + ", ".join(
                       formats_for("llama-server")) + "; vllm/sglang: " + ", ".join(formats_for("vllm")) +
                        "; inferlab: " + ", ".join(formats_for("inferlab")) + "; default: the engine's bf16 and "
                        "one per quantized slider stop it can make)")
    p.add_argument("--bits", nargs="+", action=Replaced, help=argparse.SUPPRESS)
    p.add_argument("--draft", type=int, nargs="+", default=[0, 4], help="draft tokens per step (0 = off)")
    p.add_argument("--kv-dtype", nargs="+", default=["default"],
                   help="KV cache element types in the engine's names; 'default' adds no flag")
    p.add_argument("--rates", type=float, nargs="+", default=[100.0],
                   help="requests/s, one run each per point; the highest gives the point's figures (default 100: "
                        "every request at once, the server saturated, as the explorer keeps its batch full)")
    p.add_argument("--num-requests", type=int, default=8, help="requests per rate")
    p.add_argument("--max-tokens", type=int, nargs=2, default=[16, 32], metavar=("MIN", "MAX"),
                   help="each request's answer length, drawn in [MIN, MAX]")
    p.add_argument("--quality-prompts", type=int, default=4, help="held-out prompts for greedy agreement")
    p.add_argument("--quality-tokens", type=int, default=16, help="greedy tokens per held-out prompt")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload (prompts, lengths, arrivals)")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="seconds")
    p.add_argument("--slo-tpot", type=float, default=0.2, help="seconds")
    p.add_argument("--threads", type=int, default=None, help="the server's threads (default: its own)")
    p.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="runs of the highest rate per point: its figures are the median run's, the spread of "
                        "the N runs is kept and drawn")
    p.add_argument("--ctx-per-slot", type=int, default=None, metavar="TOKENS",
                   help="llama-server: each slot's context, the longest request (prompt + answer) the chosen "
                        "command must serve (default: the sweep's own longest request, rounded up to 256)")
    p.add_argument("--port", type=int, default=None,
                   help="the servers' port (default: a free loopback port per point)")
    p.add_argument("--server-args", default="", metavar="ARGS",
                   help="more flags for every point's command line, one string (llama-server: e.g. --no-repack)")
    p.add_argument("--price-per-hour", type=float, default=2.50, help="$ per GPU-hour")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="start no point after S seconds; a point still running then is stopped (recorded failed)")
    p.add_argument("--point-timeout", type=float, default=1800.0, metavar="S",
                   help="stop a point (start and measurement) after S seconds, recorded failed")
    p.add_argument("--start-timeout", type=float, default=300.0, metavar="S", help="per server start")
    p.add_argument("--json", metavar="OUT", help="where the result goes (required unless --show-flags)")
    p.add_argument("--show-flags", action="store_true",
                   help="print the engine's flag table (knob -> flag, the version it was read from) and exit")
    p.add_argument("--csv", metavar="OUT", help="also write the points as CSV")
    p.add_argument("--png", metavar="OUT", help="also draw the points and the frontier as a PNG (no display needed)")


class Replaced(argparse.Action):
    """--bits (a bit count per weight format) is gone: two formats share a count (q4_0 and q4_1), so the
    sweep takes names; said as an error naming the new flag, never read as an alias."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} was replaced by --formats: name the weight formats, e.g. --formats "
                     "bf16,q8_0,q4_1 for llama-server or bf16,int8,fp8-e4m3,int4 for inferlab (a bit count "
                     "names no format: q4_0 and q4_1 are both 4 bits)")


def sweep_formats(args, engine: str) -> tuple[str, ...]:
    """--formats, checked against what `engine` serves (its defaults when not given)."""
    if args.formats is None:
        return default_formats(engine)
    try:
        return parse_formats(args.formats, engine)
    except ValueError as exc:
        raise SetupError(f"--formats: {exc}") from None


def make_spec(args, say):
    from app.tradeoff.tune import TuneSpec

    base = ENGINES.get(args.engine)
    if base is None:
        raise SetupError(f"unknown engine {args.engine!r} (have: {', '.join(ENGINES)})")
    exe = find_executable(base, args.server_bin)
    args.formats = list(sweep_formats(args, base.name))
    model, note = served_model(args, base, say)
    if getattr(args, "repeats", 1) < 1:
        raise SetupError(f"--repeats {args.repeats}: at least 1")
    load = TuneLoad(num_requests=args.num_requests, rates=tuple(args.rates), chat_max_tokens=tuple(args.max_tokens),
                    long_max_tokens=tuple(args.max_tokens), seed=args.seed, quality_prompts=args.quality_prompts,
                    quality_tokens=args.quality_tokens, repeats=getattr(args, "repeats", 1))
    try:
        extra = tuple(shlex.split(args.server_args))
    except ValueError as exc:  # e.g. an unclosed quote
        raise SetupError(f"--server-args {args.server_args!r}: {exc}") from None
    engine = sized_engine(base, load, extra, getattr(args, "ctx_per_slot", None))
    points = tuple(ServerPoint(batch=b, weight_format=f, kv_dtype=kv, draft=d)
                   for f in args.formats for d in args.draft for b in args.batch
                   for kv in (None if k == "default" else k for k in args.kv_dtype))
    return TuneSpec(engine=engine, exe=exe, model=model, points=points, load=load,
                    slo=SLO(args.slo_ttft, args.slo_tpot), price_per_hour=args.price_per_hour, threads=args.threads,
                    time_limit_s=args.time_limit, start_timeout_s=args.start_timeout, draft_note=note,
                    point_timeout_s=args.point_timeout, port=getattr(args, "port", None),
                    context=slot_context(engine, load, getattr(args, "ctx_per_slot", None)))


def longest_request(load: TuneLoad) -> int:
    """The sweep's longest request in tokens, prompt and answer (2 tokens per word is generous)."""
    words = load.long_words[1] if load.long_share > 0 else 48  # chat prompts: 12-48 words; held-out: 40
    return 2 * words + max(*load.chat_max_tokens, *load.long_max_tokens, load.quality_tokens) + 64


def slot_context(engine: ServerEngine, load: TuneLoad, given: int | None) -> dict | None:
    """What the chosen command's -c means per slot (llama-server only: the others size their own)."""
    per_slot = getattr(engine, "ctx_per_slot", None)
    if per_slot is None:
        return None
    return {"per_slot": per_slot, "longest_request_tokens": longest_request(load), "given": given is not None}


def sized_engine(engine: ServerEngine, load: TuneLoad, extra: tuple[str, ...],
                 ctx_per_slot: int | None = None) -> ServerEngine:
    """llama-server's context per slot: `ctx_per_slot` (the deployment's longest request), else fitted to
    the sweep's longest request; and the extra flags; other engines' tables as they are (extra flags need a
    table that takes them)."""
    from dataclasses import replace

    from app.managed.llama_server import LlamaServer
    from app.managed.sglang import SglangEngine
    from app.managed.vllm import VllmEngine

    if isinstance(engine, (VllmEngine, SglangEngine)):  # e.g. --tensor-parallel-size 2
        return replace(engine, extra=extra)
    if not isinstance(engine, LlamaServer):
        if extra:
            raise SetupError(f"--server-args: the {engine.name} table takes no extra flags")
        return engine
    longest = longest_request(load)
    if ctx_per_slot is not None and ctx_per_slot < longest:
        raise SetupError(f"--ctx-per-slot {ctx_per_slot}: shorter than the sweep's longest request (about "
                             f"{longest} tokens); its points would fail")
    return replace(engine, ctx_per_slot=ctx_per_slot or -(-longest // 256) * 256, extra=extra)


def run_tune_cli(args, draw_png: Callable[[dict, str], bool] | None = None) -> int:
    """draw_png(result, path): --png's writer (it needs Qt, which this layer does not import: app/cli.py
    passes app/gui/tune_png.py's); None refuses --png before the sweep."""
    from app.result_file import unwritable, write_or_print
    from app.tradeoff.tune import run_tune
    from app.tradeoff.tune_export import write_csv

    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.show_flags or not args.json:
        return show_flags(args.engine) if args.show_flags else _usage("--json OUT is required")
    if args.png and draw_png is None:
        return _usage("--png: no PNG writer here (it draws with Qt)")
    bad = unwritable({"json": args.json, "csv": args.csv, "png": args.png})
    if bad:  # said before the sweep, not after its minutes
        return _usage(bad)
    try:
        spec = make_spec(args, say)
    except SetupError as exc:
        print(f"inferlab tune: {exc}", file=sys.stderr)
        return 2
    say(f"tune: {spec.engine.name} ({spec.exe}), {len(spec.points)} points, model {spec.model.name}")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    result = run_tune(spec, progress=lambda text, fraction: say(f"[{100 * fraction:3.0f}%] {text}"))
    if not write_or_print(args.json, json.dumps(result, indent=2), "inferlab tune"):
        return 1  # the sweep's minutes are not lost: the result went to stdout
    say(f"wrote {args.json}: {len(result['points'])} measured, {len(result['failed'])} failed, "
        f"{len(result['not_run'])} not run, {result['wall_seconds']} s")
    if args.csv:
        write_csv(result, args.csv)
    if args.png and draw_png is not None and result["points"]:  # None was refused above
        draw_png(result, args.png)
    if result["chosen"]:
        chosen = result["chosen"]
        say(f"chosen: {chosen['label']} ({chosen['why']}):\n  {chosen['command']}")
        if chosen.get("context_said"):
            say(f"  context: {chosen['context_said']}")
    return 0


def _exit_on_sigterm(signum, _frame) -> None:
    """`kill` (or a CI timeout) ends the sweep as Ctrl-C does: the point under way stops its server."""
    raise SystemExit(128 + signum)


def show_flags(engine_name: str) -> int:
    from app.managed.describe import describe_table

    engine = ENGINES.get(engine_name)
    if engine is None:
        return _usage(f"unknown engine {engine_name!r} (have: {', '.join(ENGINES)})")
    print(describe_table(engine))
    return 0


def _usage(message: str) -> int:
    print(f"inferlab tune: {message}", file=sys.stderr)
    return 2
