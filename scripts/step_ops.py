"""The kernel launches of one decode step, by kernel, and the time a token takes: what makes a step
launch-bound on a GPU (each launch a few microseconds of the host's) or overhead-bound on a narrow model.
Counted from the code (engine/kernels/gpu/launches.py): each Triton kernel, each torch op that launches one,
each copy between host and device.

    python scripts/step_ops.py --model DIR [--device cpu] [--dtype float32] [--attention fast] [--tokens 48]
    python scripts/step_ops.py --shapes smollm2 --narrow     # a 30-layer model of tiny width: all overhead
    TRITON_INTERPRET=1 python scripts/step_ops.py --shapes smollm2 --attention triton --graphs --dtype bfloat16 \
        --no-stream-linear --tokens 0      # the CUDA path's step, counted on the CPU (its kernels interpreted)

--shapes smollm2 builds a random model of SmolLM2-135M's shapes in a temporary folder (scripts/gpu_check.py);
--narrow keeps its 30 layers and makes them 64 wide. Prints one JSON line."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--shapes", choices=["smollm2"], default=None)
    p.add_argument("--narrow", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--attention", default="fast")
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--graphs", action="store_true", help="cuda_graphs on (on the CPU: their static buffers)")
    p.add_argument("--no-stream-linear", action="store_true",
                   help="the library's products, as on CUDA (the CPU's own weight-streaming kernel is a call "
                        "no torch op shows)")
    args = p.parse_args()
    import torch

    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.kernels.gpu.launches import counting

    torch.set_num_threads(args.threads)
    model = args.model
    if model is None:
        import gpu_check

        shapes = dict(gpu_check.SMOLLM2_SHAPES)
        if args.narrow:
            shapes.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                          vocab_size=384, max_position_embeddings=2048)
        model = tempfile.mkdtemp(prefix="step-ops-")
        gpu_check.build_random_model(Path(model), shapes)

    eng = LLMEngine(EngineConfig(model=model, device=args.device, dtype=args.dtype, attention_backend=args.attention,
                                 num_kv_blocks=64, num_threads=args.threads, cuda_graphs=args.graphs or None,
                                 stream_linear=not args.no_stream_linear, max_num_seqs=8))
    eng.add_request("Hello there", SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    for _ in range(3):
        eng.step()
    with counting() as count:
        eng.step()
    while eng.has_unfinished():
        eng.step()
    per_token = []
    if args.tokens:
        params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
        eng.generate(["Hello there"], params)  # warm-up
        for _ in range(5):
            t = time.perf_counter()
            out = eng.generate(["Hello there"], params)[0]
            per_token.append((time.perf_counter() - t) / len(out.token_ids))
    print(json.dumps({"model": model if args.model else f"random {args.shapes or 'smollm2'} shapes"
                      + (", narrow" if args.narrow else ""), "device": args.device, "dtype": args.dtype,
                      "attention": args.attention, "threads": args.threads, "graphs": args.graphs,
                      "layers": eng.model_config.num_hidden_layers,
                      "launches_per_decode_step": count.total, "by_kernel": dict(count.kernels.most_common()),
                      "ms_per_token_median_of_5": round(statistics.median(per_token) * 1e3, 3) if per_token else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
