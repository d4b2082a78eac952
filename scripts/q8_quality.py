"""The quality cost of int8 activations (EngineConfig.int8_activations) in the fused decode step, on the
held-out text: every token decoded one step at a time (teacher-forced) through the fused step, as a
one-stream decode runs, with the activations exact (bf16) and rounded to int8 per 32 columns; both
against the 16-bit weights decoded the same way. Perplexity, KL(16-bit || this) per token and top-1
agreement with the 16-bit model.
    python scripts/q8_quality.py [--quant-format int4] [--windows 4] [--window 256] [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch


@torch.inference_mode()
def decode_logits(engine, ids: list[int], int8_activations: bool) -> torch.Tensor:
    """(len(ids), vocab) float32: each position's logits from a decode step of the fused path, the KV
    cache filled from slot 0 on (a fresh engine's blocks, in order)."""
    from engine.kernels import fused_decode_kernel
    from engine.runner.fused import FusedDecode

    runner = engine.runner
    fused = FusedDecode(fused_decode_kernel(), engine.model, runner.block_size, int8_activations)
    plan = fused.plan(runner.kv_caches)
    if plan is None:
        raise SystemExit(f"the fused step does not apply: {fused.unsupported}")
    bs = runner.block_size
    blocks = torch.arange(-(-len(ids) // bs), dtype=torch.int64).view(1, -1)
    out = []
    for t, tok in enumerate(ids):
        one = lambda v: torch.tensor([v], dtype=torch.int64)  # noqa: E731
        _, logits = plan.step(one(tok), one(t), one(t), blocks, one(t + 1), bs)
        out.append(logits[0])
    return torch.stack(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quant-format", choices=["int8", "int4"], default="int4")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    from app.tradeoff.sweep_quality import quality_of
    from engine import EngineConfig, LLMEngine
    from engine.quant.quality import heldout_texts, windows

    def engine(fmt):
        return LLMEngine(EngineConfig(dtype="bfloat16", quant_format=fmt, quant_embeddings=fmt != "bf16",
                                      num_threads=args.threads, num_kv_blocks=args.window // 16 + 2))

    ref_engine = engine(16)
    wins = windows(ref_engine, heldout_texts(), args.window)[: args.windows]
    refs = [decode_logits(ref_engine, ids, False) for ids in wins]
    del ref_engine
    q = engine(args.quant_format)
    rows = {}
    for name, q8 in (("16-bit", None), (f"{args.quant_format}, bf16 activations", False),
                     (f"{args.quant_format}, int8 activations", True)):
        scored = ((ids, (ref if q8 is None else decode_logits(q, ids, q8)).log_softmax(-1), ref.log_softmax(-1))
                  for ids, ref in zip(wins, refs))
        got = quality_of(scored)
        rows[name] = {"perplexity": got["perplexity"], "kl_vs_16bit_per_token": got["kl"],
                      "top1_agreement_vs_16bit": got["agreement"]}
        print(f"{name:32s} ppl {got['perplexity']:8.3f}  KL {got['kl']:.5f}  top-1 {got['agreement']:.4f}")
    result = {"quant_format": args.quant_format, "windows": len(wins), "window_tokens": args.window,
              "how": "teacher-forced decode steps through the fused path (held-out text, assets/heldout.txt)",
              "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
