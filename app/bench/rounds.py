"""What the side-by-side benches share: the engine under test, the HF baseline's model, the modes
compared, and rounds that alternate every side (medians compared)."""
from __future__ import annotations

from app.bench import hf_baseline
from app.device_args import device_options
from app.generate import stderr_progress
from engine import EngineConfig, LLMEngine


def bench_engine(args, **kw) -> LLMEngine:
    cfg = EngineConfig(model=args.model, dtype=args.dtype, **device_options(args), num_threads=args.threads, **kw)
    return LLMEngine(cfg, progress=stderr_progress)


def hf_model(engine: LLMEngine):
    return hf_baseline.load_hf(engine.model_path, engine.dtype, engine.device)


MODES = ("eager", "compile")  # the engine as built, and with compile=True (reconfigured between rounds)
# what each mode switches (between rounds): "eager" runs decode steps as one native call where it
# applies (EngineConfig.fused_decode), "layers" the same engine layer by layer (the fused step's baseline),
# "graphs" all-decode steps replayed from CUDA graphs (EngineConfig.cuda_graphs; on the CPU the same
# static buffers, uncaptured)
MODE_KNOBS = {"eager": {"compile": False, "fused_decode": True, "cuda_graphs": False},
              "compile": {"compile": True, "cuda_graphs": False},
              "layers": {"compile": False, "fused_decode": False, "cuda_graphs": False},
              "graphs": {"compile": False, "fused_decode": True, "cuda_graphs": True}}


def alternate(engine, rounds: int, ours, hf, peers: dict | None = None,
               modes: tuple[str, ...] = MODES) -> tuple[dict[str, list[dict]], list[dict]]:
    """Rounds alternate HF, the engine's modes and any peers (name -> one measured run, e.g.
    llama.cpp): the machine's speed drifts (shared hosts), and interleaving exposes every side to the
    same drift. ours(), hf(): one measured run each. Each peer's runs land in peers_runs[name]."""
    ours_runs: dict[str, list[dict]] = {m: [] for m in modes}
    hf_runs: list[dict] = []
    for _ in range(rounds):
        for mode in modes:
            engine.reconfigure(**MODE_KNOBS[mode])
            ours_runs[mode].append(ours())
        if hf is not None:
            hf_runs.append(hf())
        for name, run in (peers or {}).items():
            ours_runs.setdefault(f"peer:{name}", []).append(run())
    return ours_runs, hf_runs


def warm_up(engine, run, modes: tuple[str, ...] = MODES) -> dict[str, str]:
    """Each mode once before the rounds, so compiling (and recompiling for new shapes) stays out of them.
    Returns the path each mode's last step ran (StepStats.forward_path: "fused" or "layers"; in the
    graphs mode how many steps went through the graphs' static buffers, and how many of them replayed)."""
    paths = {}
    for mode in modes:
        engine.reconfigure(**MODE_KNOBS[mode])
        run()
        paths[mode] = engine.runner.last_path
        graphs = engine.runner.graphs  # parked (kept) when the next mode switches them off
        if mode == "graphs" and graphs is not None:
            paths[mode] += f"; {graphs.num_runs} steps in graph buffers, {graphs.num_replays} replayed"
            if graphs.capture_error:
                paths[mode] += f"; capture failed: {graphs.capture_error}"
    return paths


def kernels_used(engine) -> dict:
    """Which kernels the engine ran with, read after the rounds: what a GPU run must say before its
    figures mean anything (a kernel that failed and turned itself off says why)."""
    backend, graphs = engine.runner.backend, engine.runner.graphs
    layers = [m for m in engine.model.modules() if hasattr(m, "bits") and hasattr(m, "packed")]
    flex = backend.flex
    return {"attention_backend": backend.name, "native_decode": backend.native_decode is not None,
            "triton_kernels": backend.triton is not None,
            "flex_attention": flex is not None and flex.fn is not None, "flex_compiled": bool(flex and flex.compiled),
            "flex_error": flex.error if flex is not None else None,
            "int4_packed_layers": sum(m.bits == 4 and m.packed is not None for m in layers),
            "int8_fused_layers": sum(m.bits == 8 and bool(getattr(m, "int8_fused", False)) for m in layers),
            "quantized_layers": len(layers),
            "graphs_capture_error": graphs.capture_error if graphs is not None else None}


def memory_breakdown(engine) -> dict:
    """The engine's memory after the rounds, as the memory panel shows it (measured: on a GPU the graphs' pool
    and the activations' peak of the start-up profile step; free from NVML where it answers)."""
    import dataclasses

    return dataclasses.asdict(engine.memory())


def median_run(results: list[dict], key: str = "decode_tokens_per_s") -> dict:
    return sorted(results, key=lambda r: r[key])[len(results) // 2]
