"""Turning logits into tokens: greedy, temperature, top-k, top-p, per-request RNG, logprobs."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling_params import SamplingParams


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]
    # Per row, when logprobs were asked for: (logprob of the sampled token, [(id, logprob), ...] top-n)
    logprobs: list[tuple[float, list[tuple[int, float]]] | None]


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits: (n, vocab), already divided by temperature. top_k 0 and top_p 1 mean off."""
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    k = torch.where(top_k > 0, top_k, vocab).unsqueeze(1)
    drop = ranks >= k
    probs = sorted_logits.masked_fill(drop, -torch.inf).softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token if the mass before it already does.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= top_p.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, -torch.inf)
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> SampleResult:
    """logits: (n, vocab) float32, one row per request that produces a token this step."""
    n = logits.shape[0]
    greedy = torch.tensor([p.greedy for p in params], device=logits.device)
    chosen = logits.argmax(dim=-1)
    if not bool(greedy.all()):
        rows = [i for i, p in enumerate(params) if not p.greedy]
        sub = logits[rows] / torch.tensor([params[i].temperature for i in rows], device=logits.device).unsqueeze(1)
        if any(params[i].top_k or params[i].top_p < 1.0 for i in rows):
            top_k = torch.tensor([params[i].top_k for i in rows], device=logits.device)
            top_p = torch.tensor([params[i].top_p for i in rows], device=logits.device)
            sub = apply_top_k_top_p(sub, top_k, top_p)
        probs = sub.softmax(dim=-1)
        for j, i in enumerate(rows):
            chosen[i] = torch.multinomial(probs[j], 1, generator=generators[i]).item()
    token_ids = chosen.tolist()
    logprobs: list[tuple[float, list[tuple[int, float]]] | None] = [None] * n
    want = [i for i, p in enumerate(params) if p.logprobs is not None]
    if want:
        lp = logits[want].log_softmax(dim=-1)
        top_n = max(params[i].logprobs for i in want)
        top_vals, top_ids = lp.topk(max(top_n, 1), dim=-1)
        for j, i in enumerate(want):
            k = params[i].logprobs
            alts = list(zip(top_ids[j, :k].tolist(), top_vals[j, :k].tolist()))
            logprobs[i] = (lp[j, token_ids[i]].item(), alts)
    return SampleResult(token_ids, logprobs)
