"""Quality, measured: perplexity on held-out text, KL divergence and greedy agreement against the 16-bit
weights, and the activation statistics used to pick outlier channels."""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from engine.events import StepKind
from engine.quant.weight_only import QUANTIZABLE

HELDOUT = Path(__file__).resolve().parents[2] / "assets" / "heldout.txt"


def heldout_texts() -> list[str]:
    """The held-out text shipped in assets/, split into paragraphs."""
    return [p.strip() for p in HELDOUT.read_text(encoding="utf-8").split("\n\n") if p.strip()]


def windows(engine, texts: Sequence[str], window: int = 512) -> list[list[int]]:
    window = min(window, getattr(engine, "max_model_len", window))
    out = []
    for text in texts:
        ids = engine.tokenizer.encode(text)
        out.extend(ids[i : i + window] for i in range(0, len(ids), window) if len(ids[i : i + window]) > 1)
    return out


def window_nll(ids: Sequence[int], logp: torch.Tensor) -> float:
    """The summed negative log-likelihood of each next token of a window (len(ids) - 1 of them), from its
    log-probabilities (len(ids), vocab)."""
    return -float(logp[:-1].gather(1, torch.tensor(ids[1:], device=logp.device)[:, None]).sum())


@torch.inference_mode()
def perplexity(engine, texts: Sequence[str], window: int = 512) -> float:
    """exp(mean next-token negative log-likelihood) over every token of every text."""
    nll, count = 0.0, 0
    for ids in windows(engine, texts, window):
        nll += window_nll(ids, engine.score(ids).log_softmax(-1))
        count += len(ids) - 1
    return math.exp(nll / count)


@torch.inference_mode()
def compare_logits(engine, texts: Sequence[str], reference: list[torch.Tensor], window: int = 512) -> dict:
    """KL(reference || current) per token (mean) and teacher-forced greedy agreement (quality_of's)."""
    q = quality_of((ids, engine.score(ids).log_softmax(-1), ref.log_softmax(-1))
                   for ids, ref in zip(windows(engine, texts, window), reference))
    return {"kl_divergence": q["kl"], "greedy_agreement": q["agreement"]}


def quality_of(scored, ppl16: float | None = None) -> dict:
    """scored: (token ids, this model's log-probabilities, the 16-bit model's) per window -> perplexity
    (and its change against `ppl16`), KL(16-bit || this) per token and top-1 agreement."""
    nll, kl, agree, count, positions = 0.0, 0.0, 0, 0, 0
    for ids, cur, ref in scored:
        nll += window_nll(ids, cur)
        count += len(ids) - 1
        kl += float((ref.exp() * (ref - cur)).sum())
        agree += int((ref.argmax(-1) == cur.argmax(-1)).sum())
        positions += len(ids)
    ppl = math.exp(nll / count)
    return {"perplexity": ppl, "ppl_delta_pct": None if ppl16 is None else 100.0 * (ppl / ppl16 - 1.0),
            "kl": kl / positions, "agreement": agree / positions}


@torch.inference_mode()
def reference_logits(engine, texts: Sequence[str], window: int = 512) -> list[torch.Tensor]:
    return [engine.score(ids) for ids in windows(engine, texts, window)]


@torch.inference_mode()
def activation_absmax(engine, texts: Sequence[str], window: int = 256) -> dict[str, torch.Tensor]:
    """Per quantizable layer, the largest |activation| seen on each input channel."""
    stats: dict[str, torch.Tensor] = {}
    hooks = []
    for name, mod in engine.model.named_modules():
        if name.split(".")[-1] in QUANTIZABLE:
            def hook(_m, args, name=name):
                m = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float().cpu()
                stats[name] = torch.maximum(stats[name], m) if name in stats else m
            hooks.append(mod.register_forward_pre_hook(hook))
    try:
        for ids in windows(engine, texts, window)[:4]:
            _forward_fresh(engine, ids)
    finally:
        for h in hooks:
            h.remove()
    return stats


def _forward_fresh(engine, ids: list[int]) -> None:
    """One prefill pass in a throw-away KV cache: works before the engine's own cache exists."""
    from engine.core.block_manager import BlockManager
    from engine.core.request import Request
    from engine.core.scheduler import ScheduledRequest
    from engine.runner.attention_backend import eager_backend
    from engine.runner.model_runner import ModelRunner
    from engine.sampling_params import SamplingParams

    bs = engine.config.block_size
    blocks = -(-len(ids) // bs)
    runner = ModelRunner(engine.model, engine.model_config, blocks, bs, engine.device, engine.dtype,
                         eager_backend(engine.config.attention_backend))
    bm = BlockManager(blocks, bs, enable_prefix_caching=False)
    bm.allocate("calibration", ids, len(ids))
    runner.forward([ScheduledRequest(Request("calibration", ids, SamplingParams(max_tokens=1)), len(ids),
                                     StepKind.PREFILL)], bm)
