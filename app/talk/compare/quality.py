"""Quality of one configuration against the first, on held-out text (engine/quant/quality.py):
perplexity, KL divergence and teacher-forced greedy agreement."""
from __future__ import annotations

from engine.quant.quality import compare_logits, heldout_texts, perplexity, reference_logits

WINDOW = 256  # tokens per scored window: small enough for 2 cores, long enough for real context
KL_WINDOWS = 2  # windows compared token by token with the first configuration (logits kept in memory)
TEXT_CHARS = 4000  # the first paragraphs of the held-out text up to this many characters (~1000 tokens)
QUALITY = ("perplexity", "kl_divergence", "greedy_agreement_pct")


class QualityMeter:
    def __init__(self) -> None:
        self.reference = None  # logits of the first configuration that measured quality

    def measure(self, engine) -> dict[str, float]:
        texts, total = [], 0
        for t in heldout_texts():
            if total >= TEXT_CHARS:
                break
            texts.append(t)
            total += len(t)
        out = {"perplexity": perplexity(engine, texts, WINDOW)}
        if self.reference is None:
            self.reference = reference_logits(engine, texts, WINDOW)[:KL_WINDOWS]
        cmp = compare_logits(engine, texts, self.reference, WINDOW)
        out["kl_divergence"] = cmp["kl_divergence"]
        out["greedy_agreement_pct"] = 100 * cmp["greedy_agreement"]
        return out
