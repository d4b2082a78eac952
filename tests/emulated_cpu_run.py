"""Run by tests/test_kernel_tiers.py, natively and under qemu-x86_64 emulating another CPU: what this process
takes the CPU to be (kernel tier, torch's capability, the dtype plan) and the greedy tokens of a tiny model at
16, 8 and 4 bits, as one JSON line. argv: the model folder [, threads (default 1)]. Not a test itself (no
test_ prefix)."""
from __future__ import annotations

import json
import sys

import torch

from engine import EngineConfig, LLMEngine, SamplingParams, kernels
from engine.kernels import build
from engine.runner.cpu_compute import plan_compute

PROMPTS = ["hello world", "the cat sat on the mat " * 6]  # a short prompt and one of many prompt rows


def main(folder: str, threads: int = 1) -> None:
    torch.manual_seed(0)
    out = {"tier": kernels.cpu_tier(), "tiers": list(kernels.supported_tiers()),
           "torch_capability": str(torch.backends.cpu.get_cpu_capability()),
           "plan": plan_compute("auto", torch.device("cpu")).describe(), "tokens": {},
           "build": build.build_name(kernels.cpu_tier()), "described": kernels.describe_tier(),
           "flags": sorted(kernels.cpu_flags())}
    for fmt in ("bf16", "int8", "int4"):
        eng = LLMEngine(EngineConfig(model=folder, quant_format=fmt, num_kv_blocks=32, num_threads=threads))
        out["fused"] = eng.runner.fused is not None
        done = eng.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0.0))
        out["tokens"][str(fmt)] = [list(o.token_ids) for o in done]
    module = kernels.kernel_module(tier=out["tier"])
    out["openmp"], out["pool_threads"] = bool(module.openmp()), int(module.pool_threads())
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
