"""Speculative decoding: proposers guess the next k tokens, the target checks them in one pass.

Verification is exact (Leviathan et al. / Chen et al.). For each draft position i, with p the target's
distribution (after temperature, top-k, top-p) and q the proposer's:
  - accept draft token x_i with probability min(1, p(x_i) / q(x_i));
  - at the first rejection, emit a token sampled from normalize(max(0, p - q)) and stop;
  - when every draft is accepted, emit one bonus token sampled from p at the next position.
The emitted tokens are then distributed exactly as if the target had decoded alone. Our proposers are
deterministic (greedy draft model, n-gram lookup), so q is one-hot: accept with probability p(x_i), and
on rejection sample from p with x_i removed. Under greedy decoding p is one-hot too, so this reduces to
"keep drafts while they equal the target's argmax, then take the argmax".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.events import TokenSource
from engine.models.layers.sampler import apply_top_k_top_p, scale_by_temperature
from engine.sampling_params import SamplingParams


@dataclass(slots=True)
class VerifyResult:
    tokens: list[int]  # accepted drafts, then one corrected or bonus token
    sources: list[TokenSource]
    num_accepted: int


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(n, vocab) float32 logits -> the distribution the target samples from at each position."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = scale_by_temperature(logits, torch.full((logits.shape[0],), params.temperature, device=logits.device))
    if params.top_k or params.top_p < 1.0:
        n = logits.shape[0]
        logits = apply_top_k_top_p(logits, torch.full((n,), params.top_k, device=logits.device),
                                   torch.full((n,), params.top_p, device=logits.device))
    return logits.softmax(-1)


def verify(draft: list[int], logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | None, batched: bool | None = None,
           argmax: list[int] | None = None) -> VerifyResult:
    """draft: k proposed tokens; logits: (k + 1, vocab) target logits at the positions that predict
    draft[0..k-1] and the bonus token. A pure function of its inputs (and the generator's state).

    Greedy: the target's argmax at every position, read back once; drafts are kept while they equal it.
    Sampling walks the drafts in turn; on a GPU (`batched`, default: not the CPU) every position is
    decided at once and read back in one copy instead of one wait per draft (_verify_batched).
    `argmax`: the logits' argmax per row when the caller already read it back (the model runner reads
    every greedy verify of a step with its sampled tokens, in one copy)."""
    if params.greedy:
        return _verify_greedy(draft, logits, argmax)
    probs = target_probs(logits, params)
    batched = logits.device.type != "cpu" if batched is None else batched
    return (_verify_batched if batched else _verify_sequential)(draft, probs, params, generator)


def _verify_greedy(draft: list[int], logits: torch.Tensor, argmax: list[int] | None = None) -> VerifyResult:
    """p is one-hot at the argmax: a draft is accepted iff it is the argmax, and the residual of a
    rejected one is p itself (its draft was not the argmax), whose sample is the argmax."""
    top = argmax if argmax is not None else logits.argmax(-1).tolist()  # the one copy back, if not done
    n = next((i for i, x in enumerate(draft) if x != top[i]), len(draft))
    sources = [TokenSource.ACCEPTED] * n
    sources.append(TokenSource.CORRECTED if n < len(draft) else TokenSource.BONUS if draft else TokenSource.DECODED)
    return VerifyResult(list(draft[:n]) + [top[n]], sources, n)


def _verify_sequential(draft: list[int], probs: torch.Tensor, params: SamplingParams,
                       generator: torch.Generator | None) -> VerifyResult:
    """One draft at a time (on the CPU a read-back costs nothing, and stopping early saves work)."""
    tokens: list[int] = []
    sources: list[TokenSource] = []
    for i, x in enumerate(draft):
        p = probs[i]
        u = torch.rand((), generator=generator, device=p.device)
        if float(p[x]) >= 1.0 or float(u) < float(p[x]):
            tokens.append(x)
            sources.append(TokenSource.ACCEPTED)
            continue
        residual = p.clone()
        residual[x] = 0.0  # normalize(max(0, p - q)) with q one-hot at x
        tokens.append(_sample(residual, params, generator))
        sources.append(TokenSource.CORRECTED)
        return VerifyResult(tokens, sources, i)
    tokens.append(_sample(probs[len(draft)], params, generator))
    sources.append(TokenSource.BONUS if draft else TokenSource.DECODED)
    return VerifyResult(tokens, sources, len(draft))


def _verify_batched(draft: list[int], probs: torch.Tensor, params: SamplingParams,
                    generator: torch.Generator | None) -> VerifyResult:
    """Every position at once on the device, one copy back: whether each draft is accepted
    (u < p(x_i); p(x_i) = 1 always accepts), and the token each position would emit if the walk stopped
    there (row i < k: a sample of the residual p with x_i removed; row k: the bonus). The walk stops at
    the first rejection; the samples are independent of the acceptance draws, so taking the stopping
    row's sample keeps the rule above exact."""
    k = len(draft)
    dev = probs.device
    residual = probs.clone()  # (k + 1, vocab)
    accept = torch.zeros(0, dtype=torch.bool, device=dev)
    if k:
        idx = torch.tensor(draft, dtype=torch.long, device=dev).unsqueeze(1)
        residual[:k].scatter_(1, idx, 0.0)  # normalize(max(0, p - q)) with q one-hot at x_i
        px = probs[:k].gather(1, idx).squeeze(1)
        accept = (px >= 1.0) | (torch.rand(k, generator=generator, device=dev) < px)
    # a row with nothing left (p(x_i) = 1: always accepted) samples from p instead of an empty residual
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, probs)
    emit = torch.multinomial(residual / residual.sum(-1, keepdim=True), 1, generator=generator).squeeze(1)
    host = torch.cat([accept.long(), emit]).tolist()  # the one copy back
    accepted, emitted = host[:k], host[k:]
    n = next((i for i, a in enumerate(accepted) if not a), k)
    sources = [TokenSource.ACCEPTED] * n
    sources.append(TokenSource.CORRECTED if n < k else TokenSource.BONUS if draft else TokenSource.DECODED)
    return VerifyResult(list(draft[:n]) + [emitted[n]], sources, n)


def _sample(p: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    if params.greedy:
        return int(p.argmax())
    return int(torch.multinomial(p / p.sum(), 1, generator=generator))


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens (longest n
    first) and propose what followed it. Free to run; good when the answer quotes its prompt."""

    name = "ngram"

    def __init__(self, max_n: int = 4, min_n: int = 1) -> None:
        self.max_n, self.min_n = max_n, min_n

    def propose(self, tokens: list[int], k: int) -> list[int]:
        n_tokens = len(tokens)
        for n in range(min(self.max_n, n_tokens - 1), self.min_n - 1, -1):
            tail = tokens[-n:]
            # search backwards, excluding the tail itself
            for start in range(n_tokens - n - 1, -1, -1):
                if tokens[start : start + n] == tail:
                    follow = tokens[start + n : start + n + k]
                    if follow:
                        return follow
        return []


@dataclass(slots=True)
class TreeVerifyResult(VerifyResult):
    path: list[int]  # the accepted draft rows, root to leaf (row i is draft i - 1)


def verify_tree(drafts: list[int], parents: list[int], logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None) -> TreeVerifyResult:
    """Verify a tree of drafts in one pass. Row 0 is the last known token, row i the draft drafts[i-1]
    whose parent row is parents[i-1]; logits (rows, vocab) predict the token after each row.

    Walking down from the root, the children of a row are tried in turn, each a deterministic proposal
    (q one-hot): accept child x with probability p(x) under what is left of p; on rejection set p(x) = 0
    and renormalize (the residual max(0, p - q)). The first accepted child becomes the row to continue
    from; when none is, sample from the residual. Each row's emitted token is then distributed exactly as
    p, so the text is distributed as the target's (greedy: p is one-hot, so this follows the argmax).
    """
    probs = target_probs(logits, params)
    children: list[list[int]] = [[] for _ in range(len(drafts) + 1)]
    for row, parent in enumerate(parents, start=1):
        children[parent].append(row)
    tokens: list[int] = []
    sources: list[TokenSource] = []
    path: list[int] = []
    row = 0
    while True:
        p = probs[row].clone()
        chosen = None
        for child in children[row]:
            x = drafts[child - 1]
            total = float(p.sum())
            px = float(p[x]) / total if total > 0 else 0.0
            u = 0.5 if params.greedy else float(torch.rand((), generator=generator, device=p.device))
            if u < px:
                chosen = child
                break
            p[x] = 0.0
        if chosen is None:
            tokens.append(_sample(p, params, generator))
            sources.append(TokenSource.CORRECTED if children[row] else
                           TokenSource.BONUS if path else TokenSource.DECODED)
            return TreeVerifyResult(tokens, sources, len(path), path)
        tokens.append(drafts[chosen - 1])
        sources.append(TokenSource.ACCEPTED)
        path.append(chosen)
        row = chosen
