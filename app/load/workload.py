"""Synthetic but reproducible workloads built from real text of the model's own tokenizer."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from app.load.kinds import PromptKind

_ASSET = Path(__file__).resolve().parents[2] / "assets" / "heldout.txt"
_FALLBACK = ("Inference engineering is the craft of turning a trained model into a fast, cheap and reliable "
             "service. Prefill reads the prompt in parallel; decode writes one token per pass. ")


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int
    kind: PromptKind  # chats and long documents


def corpus_tokens(tokenizer) -> list[int]:
    text = _ASSET.read_text() if _ASSET.exists() else _FALLBACK * 200
    return tokenizer.encode(text, add_special_tokens=False)


def mixed_workload(tokenizer, num_chats: int = 36, num_docs: int = 12, seed: int = 0,
                   chat_prompt=(16, 128), doc_prompt=(512, 1536), output=(16, 256)) -> list[BenchRequest]:
    """Short chats and long documents, interleaved, output lengths spread over `output`."""
    rng = random.Random(seed)
    corpus = corpus_tokens(tokenizer)
    reqs = []
    kinds = [PromptKind.CHAT] * num_chats + [PromptKind.LONG] * num_docs
    rng.shuffle(kinds)
    for kind in kinds:
        lo, hi = chat_prompt if kind == PromptKind.CHAT else doc_prompt
        n = rng.randint(lo, hi)
        start = rng.randrange(0, max(1, len(corpus) - n))
        ids = (corpus * (1 + n // max(len(corpus), 1)))[start : start + n]
        reqs.append(BenchRequest(ids, rng.randint(*output), kind))
    return reqs
