"""The baseline: Hugging Face transformers `generate` on the same weights, static batches."""
from __future__ import annotations

import time

import torch

from app.load.workload import BenchRequest


def load_hf(folder: str, dtype: torch.dtype, device: torch.device | str = "cpu"):
    """The same weights on the engine's device (a GPU bench compares against HF on that GPU)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    return model.to(device)


def _sync(model) -> None:
    """Wait for the GPU's queued work before reading a clock (a CPU model has none)."""
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


@torch.inference_mode()
def hf_generate_static(model, requests: list[BenchRequest], batch_size: int, pad_id: int) -> dict:
    """Static batching: each group runs until its longest request is done; left padding."""
    useful = 0
    generated = 0
    t0 = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        group = requests[i : i + batch_size]
        width = max(len(r.prompt_token_ids) for r in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for j, r in enumerate(group):
            n = len(r.prompt_token_ids)
            ids[j, width - n :] = torch.tensor(r.prompt_token_ids)
            mask[j, width - n :] = 1
        new = max(r.max_tokens for r in group)
        ids, mask = ids.to(model.device), mask.to(model.device)
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, pad_token_id=pad_id)
        useful += sum(r.max_tokens for r in group)
        generated += new * len(group)
    _sync(model)
    dt = time.perf_counter() - t0
    return {"seconds": dt, "useful_output_tokens": useful, "computed_output_tokens": generated,
            "output_tokens_per_s": useful / dt}


@torch.inference_mode()
def hf_one_stream(model, prompt_ids: list[int], max_tokens: int) -> dict:
    ids = torch.tensor([prompt_ids], device=model.device)
    _sync(model)
    t0 = time.perf_counter()
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False)
    _sync(model)
    ttft = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                         min_new_tokens=max_tokens, do_sample=False)
    _sync(model)
    dt = time.perf_counter() - t0
    tokens = out[0, len(prompt_ids):].tolist()
    return {"seconds": dt, "ttft_s": ttft, "tokens": tokens,
            "decode_tokens_per_s": (max_tokens - 1) / max(dt - ttft, 1e-9),
            "tokens_per_s": max_tokens / dt}
