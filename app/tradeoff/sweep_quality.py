"""Quality of one weight format against the 16-bit model in ONE scoring pass over the held-out text:
perplexity, KL(16-bit || this) per token and teacher-forced top-1 agreement (the same definitions as
engine/quant/quality.py's perplexity and compare_logits, which score the text once each; quality_of there)."""
from __future__ import annotations

import math

import torch

from engine.quant.quality import quality_of, window_nll, windows


@torch.inference_mode()
def reference_pass(engine, texts) -> tuple[list[torch.Tensor], float]:
    """The 16-bit engine's log-probabilities per window, and its perplexity from the same pass."""
    reference, nll, count = [], 0.0, 0
    for ids in windows(engine, texts):
        logp = engine.score(ids).log_softmax(-1)
        reference.append(logp)
        nll += window_nll(ids, logp)
        count += len(ids) - 1
    return reference, math.exp(nll / count)


@torch.inference_mode()
def quality_pass(engine, texts, reference: list[torch.Tensor], ppl16: float) -> dict:
    return quality_of(((ids, engine.score(ids).log_softmax(-1), ref)
                       for ids, ref in zip(windows(engine, texts), reference)), ppl16)
