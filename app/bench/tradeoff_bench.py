"""`inferlab bench tradeoff --json OUT`: the tradeoff sweep headless (app/tradeoff/sweep.py), with the machine's
roofs, the frontier and the predicted points (kept apart from the measured ones)."""
from __future__ import annotations

import time

from app.device_args import device_options
from app.tradeoff.sweep import SweepSpec, run_sweep
from app.tradeoff.sweep_point import Workload
from engine.quant_formats import QUANT_FORMAT_NAMES


def add_args(p, engine_args) -> None:
    engine_args(p)
    p.add_argument("--json", metavar="OUT", help="write the results here")
    p.add_argument("--max-num-seqs", "--batches", type=int, nargs="+", default=[1, 8, 32], help="batch sizes")
    p.add_argument("--quant-format", nargs="+", default=list(QUANT_FORMAT_NAMES), choices=QUANT_FORMAT_NAMES,
                   help="weight formats (default: all)")
    p.add_argument("--num-draft-tokens", "--drafts", type=int, nargs="+", default=[0, 4], help="n-gram draft lengths")
    p.add_argument("--warmup-s", type=float, default=1.0, help="per point, before measuring")
    p.add_argument("--measure-s", type=float, default=4.0, help="per point")
    p.add_argument("--price", type=float, default=2.50, help="$ per GPU-hour")
    p.add_argument("--memory-budget-mib", type=int, default=1024, help="weights + KV of each sweep engine")
    p.add_argument("--csv", metavar="OUT", help="also export the points as CSV")
    p.add_argument("--save", action="store_true", help="store the result for the app (per machine and model)")
    p.add_argument("--reprobe", action="store_true", help="measure the roofs again (replaces the cached ones)")


def run(args) -> dict:
    from engine.config import EngineConfig
    from engine.loading.loader import load_model
    from engine.perf.probe import probe_roofs
    from engine.runner.setup import resolve_device

    t0 = time.perf_counter()
    roofs = probe_roofs(resolve_device(args.device), refresh=args.reprobe)  # the sweep engines' device
    probe_s = time.perf_counter() - t0
    loaded = load_model(args.model)
    base = EngineConfig(model=args.model, dtype=args.dtype, **device_options(args), num_threads=args.threads)
    spec = SweepSpec(max_num_seqs=tuple(args.max_num_seqs), quant_format=tuple(args.quant_format),
                     num_speculative_tokens=tuple(args.num_draft_tokens),
                     warmup_s=args.warmup_s, measure_s=args.measure_s, price_per_hour=args.price,
                     memory_budget_bytes=args.memory_budget_mib * 2**20, workload=Workload())
    result = run_sweep(loaded, base, spec, roofs,
                       progress=lambda text, f: print(f"[{100 * f:3.0f}%] {text}", flush=True, file=_stderr()))
    result["model"] = loaded.path
    result["probe_seconds"] = probe_s
    result["wall_seconds"] = time.perf_counter() - t0
    if args.csv:
        from app.tradeoff.sweep_store import export_csv

        export_csv(result, args.csv)
    if args.save:
        from app.tradeoff.sweep_store import save

        result["stored_at"] = str(save(result, roofs.machine, loaded.path))
    return result


def _stderr():
    import sys

    return sys.stderr
