"""Quality of one configuration against the first, on held-out text (engine/quant/quality.py):
perplexity, KL divergence and teacher-forced greedy agreement, from one scoring pass over the text."""
from __future__ import annotations

import math

import torch

from engine.quant.quality import heldout_texts, quality_of, window_nll, windows

WINDOW = 256  # tokens per scored window: small enough for 2 cores, long enough for real context
KL_WINDOWS = 2  # windows compared token by token with the first configuration (logits kept in memory)
TEXT_CHARS = 4000  # the first paragraphs of the held-out text up to this many characters (~1000 tokens)
QUALITY = ("perplexity", "kl_divergence", "greedy_agreement_pct")


def scored_texts() -> list[str]:
    """The held-out text's first paragraphs, up to TEXT_CHARS characters (the one that crosses it included)."""
    texts, total = [], 0
    for t in heldout_texts():
        if total >= TEXT_CHARS:
            break
        texts.append(t)
        total += len(t)
    return texts


class QualityMeter:
    def __init__(self) -> None:
        self.reference = None  # logits of the first configuration that measured quality

    def measure(self, engine) -> dict[str, float]:
        texts = scored_texts()
        # each window scored once: every window's tokens count toward perplexity, the first KL_WINDOWS'
        # log-probabilities are kept (the first configuration's as the reference) or compared with it
        nll, count, kept = 0.0, 0, []
        with torch.inference_mode():
            for i, ids in enumerate(windows(engine, texts, WINDOW)):
                logp = engine.score(ids).log_softmax(-1)
                nll += window_nll(ids, logp)
                count += len(ids) - 1
                if i < KL_WINDOWS:
                    kept.append((ids, logp))
        if self.reference is None:
            self.reference = [logp for _, logp in kept]
        cmp = quality_of((ids, logp, ref) for (ids, logp), ref in zip(kept, self.reference))
        return {"perplexity": math.exp(nll / count), "kl_divergence": cmp["kl"],
                "greedy_agreement_pct": 100 * cmp["agreement"]}
