"""--device, --gpu-memory-utilization, --cuda-graphs and the engine's thread count: the same for the app and
every engine command."""
from __future__ import annotations

import argparse

# The desktop app usually runs on the GPU that also drives the display (its compositor, the browser):
# it takes less of it than a headless command, which may have the GPU to itself.
APP_GPU_MEMORY_UTILIZATION = 0.80
HEADLESS_GPU_MEMORY_UTILIZATION = 0.90


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share such as 0.8, got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1], got {value}")
    return value


def add_device_args(p: argparse.ArgumentParser, utilization: float) -> None:
    p.add_argument("--device", default="auto",
                   help="cpu, cuda, cuda:1, ... (auto: $INFERLAB_DEVICE, else CUDA when torch sees a GPU, else cpu)")
    p.add_argument("--gpu-memory-utilization", type=_share, default=utilization, metavar="SHARE",
                   help=f"share of the GPU's memory the engine may take when no KV budget is given; the rest "
                        f"stays free for other programs (default {utilization})")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay all-decode steps from CUDA graphs captured at start-up (EngineConfig.cuda_graphs; "
                        "default: on where the engine runs on CUDA; --no-cuda-graphs turns them off; on the CPU "
                        "--cuda-graphs runs the same static buffers without capture)")


def device_options(args: argparse.Namespace) -> dict:
    """The EngineConfig fields these options set (a Namespace made by hand may lack all but --device)."""
    share = vars(args).get("gpu_memory_utilization") or HEADLESS_GPU_MEMORY_UTILIZATION
    return {"device": args.device, "gpu_memory_utilization": share, "cuda_graphs": vars(args).get("cuda_graphs")}


def engine_threads() -> int:
    """The count the app's engine starts with on this machine now: the cores free now (the app's engine then
    follows them, leaving its GUI thread a core only while that keeps one busy: engine/runner/threads.py).
    What `prepare` stores its results under and `bench gui` runs at."""
    from engine.runner.threads import choose_threads

    return choose_threads(None).count
