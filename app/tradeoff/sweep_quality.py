"""Quality of one bits setting against the 16-bit model in ONE scoring pass over the held-out text:
perplexity, KL(16-bit || this) per token and teacher-forced top-1 agreement (the same definitions as
engine/quant/quality.py's perplexity and compare_logits, which score the text once each)."""
from __future__ import annotations

import math

import torch

from engine.quant.quality import windows


@torch.inference_mode()
def reference_pass(engine, texts) -> tuple[list[torch.Tensor], float]:
    """The 16-bit engine's log-probabilities per window, and its perplexity from the same pass."""
    reference, nll, count = [], 0.0, 0
    for ids in windows(engine, texts):
        logp = engine.score(ids).log_softmax(-1)
        reference.append(logp)
        nll -= float(logp[:-1].gather(1, torch.tensor(ids[1:], device=logp.device)[:, None]).sum())
        count += len(ids) - 1
    return reference, math.exp(nll / count)


@torch.inference_mode()
def quality_pass(engine, texts, reference: list[torch.Tensor], ppl16: float) -> dict:
    return quality_of(((ids, engine.score(ids).log_softmax(-1), ref)
                       for ids, ref in zip(windows(engine, texts), reference)), ppl16)


def quality_of(scored, ppl16: float | None = None) -> dict:
    """scored: (token ids, this model's log-probabilities, the 16-bit model's) per window -> perplexity
    (and its change against `ppl16`), KL(16-bit || this) per token and top-1 agreement."""
    nll, kl, agree, count, positions = 0.0, 0.0, 0, 0, 0
    for ids, cur, ref in scored:
        nll -= float(cur[:-1].gather(1, torch.tensor(ids[1:], device=cur.device)[:, None]).sum())
        count += len(ids) - 1
        kl += float((ref.exp() * (ref - cur)).sum())
        agree += int((ref.argmax(-1) == cur.argmax(-1)).sum())
        positions += len(ids)
    ppl = math.exp(nll / count)
    return {"perplexity": ppl, "ppl_delta_pct": None if ppl16 is None else 100.0 * (ppl / ppl16 - 1.0),
            "kl": kl / positions, "agreement": agree / positions}
