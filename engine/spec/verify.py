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

from engine.events import SpecMethod, TokenSource
from engine.models.layers.read_back import to_host
from engine.models.layers.sampler import shape_logits
from engine.sampling_params import SamplingParams


@dataclass(slots=True)
class VerifyResult:
    tokens: list[int]  # accepted drafts, then one corrected or bonus token
    sources: list[TokenSource]
    num_accepted: int


@dataclass(slots=True)
class TreeVerifyResult(VerifyResult):
    path: list[int]  # the accepted draft rows, root to leaf (row i is draft i - 1)


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(n, vocab) float32 logits -> the distribution the target samples from at each position."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return shape_logits(logits, [params] * logits.shape[0]).softmax(-1)  # the sampler's own distribution


def verify(draft: list[int], logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | None, batched: bool | None = None,
           read_back: list[int] | None = None) -> VerifyResult:
    """draft: k proposed tokens; logits: (k + 1, vocab) target logits at the positions that predict
    draft[0..k-1] and the bonus token. A pure function of its inputs (and the generator's state).

    Every decision is taken on the device at once (decide_on_device: greedy, each row's argmax; sampling,
    each draft's acceptance and each row's residual sample) and read back in one copy, then walked on the
    host (walk_decisions). `read_back`: those decisions when the caller already read them back (the model
    runner reads every verify of a step with its sampled tokens, in one copy). `batched=False` (default on
    the CPU when nothing was read back) walks a sampling verify one draft at a time instead, which stops
    early (_verify_sequential)."""
    if read_back is None and not params.greedy and not (logits.device.type != "cpu" if batched is None else batched):
        return _verify_sequential(draft, target_probs(logits, params), params, generator)
    parents = chain_parents(len(draft))
    if read_back is None:
        read_back = to_host(decide_on_device(draft, parents, logits, params, generator))
    return walk_decisions(draft, parents, read_back, params.greedy)


def chain_parents(k: int) -> list[int]:
    """A chain of k drafts as a tree (verify_tree's layout): draft i's parent is row i, row 0 being the
    last known token."""
    return list(range(k))


def decide_on_device(draft: list[int], parents: list[int], logits: torch.Tensor, params: SamplingParams,
                     generator: torch.Generator | None) -> torch.Tensor:
    """Every decision of a verify run (a chain or a tree: verify_tree's layout), computed where the logits
    are and not read back: a 1-D integer tensor that walk_decisions walks on the host.
    Greedy: each row's argmax, (rows,). Sampling: for each draft, whether it is accepted when the walk
    reaches its parent row and its earlier siblings were rejected (u < p(x) / the mass the earlier
    siblings left: the residual max(0, p - q) of each rejection, renormalized), then for each row the token
    it emits if the walk stops there (a sample of p with every child's token removed; a leaf's is the
    bonus, from p) - (len(draft) + rows,). The draws of rows the walk never reaches are independent of
    those it does, so taking them all up front keeps the rule exact."""
    if params.greedy:
        return logits.argmax(-1)
    probs = target_probs(logits, params)  # (rows, vocab)
    dev, k = probs.device, len(draft)
    residual = probs.clone()
    accept = torch.zeros(0, dtype=torch.long, device=dev)
    if k:
        parent = torch.tensor(parents, device=dev)
        token = torch.tensor(draft, device=dev)
        px = probs[parent, token]  # (k,)
        earlier, repeated = _siblings(draft, parents)
        left = probs[parent].sum(-1)
        if earlier is not None:  # the mass earlier (distinct) siblings took, on their rejection
            left = left - earlier.to(dev, px.dtype) @ px
        ratio = torch.where(left > 0, px / left.clamp_min(torch.finfo(px.dtype).tiny), 0.0)
        u = torch.rand(k, generator=generator, device=dev)
        accept = ((u < ratio) & ~repeated.to(dev)).long()
        residual[parent, token] = 0.0  # normalize(max(0, p - q)), q one-hot at each child's token
    # a row with nothing left (its children took all of p: one of them is always accepted) samples p
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, probs)
    emit = torch.multinomial(residual / residual.sum(-1, keepdim=True), 1, generator=generator).squeeze(1)
    return torch.cat([accept, emit])


def _siblings(draft: list[int], parents: list[int]) -> tuple[torch.Tensor | None, torch.Tensor]:
    """((k, k) earlier[d, e] = 1 where draft e is an earlier sibling of d with another token, or None when
    no row has two children; (k,) True for a draft repeating an earlier sibling's token: p(x) is 0 for it
    once that sibling is rejected)."""
    k = len(draft)
    repeated = torch.zeros(k, dtype=torch.bool)
    by_parent: dict[int, list[int]] = {}
    pairs = []
    for d, (p, x) in enumerate(zip(parents, draft)):
        firsts = by_parent.setdefault(p, [])
        if any(draft[e] == x for e in firsts):
            repeated[d] = True
            continue
        pairs.extend((d, e) for e in firsts)
        firsts.append(d)
    if not pairs:
        return None, repeated
    earlier = torch.zeros(k, k)
    earlier[[d for d, _ in pairs], [e for _, e in pairs]] = 1.0
    return earlier, repeated


def walk_decisions(draft: list[int], parents: list[int], host: list[int], greedy: bool) -> TreeVerifyResult:
    """Walk down from row 0 with decide_on_device's decisions read back (`host`): at each row the first
    child accepted (greedy: whose token is the row's argmax) is taken; a row with none emits its token
    (corrected, or the bonus at the end of an accepted path) and the walk ends."""
    k = len(draft)
    children: list[list[int]] = [[] for _ in range(k + 1)]
    for row, parent in enumerate(parents, start=1):
        children[parent].append(row)
    emit = host if greedy else host[k:]
    tokens: list[int] = []
    sources: list[TokenSource] = []
    path: list[int] = []
    row = 0
    while True:
        chosen = next((c for c in children[row] if (draft[c - 1] == host[row] if greedy else host[c - 1])), None)
        if chosen is None:
            tokens.append(emit[row])
            sources.append(TokenSource.CORRECTED if children[row] else
                           TokenSource.BONUS if path else TokenSource.DECODED)
            return TreeVerifyResult(tokens, sources, len(path), path)
        tokens.append(draft[chosen - 1])
        sources.append(TokenSource.ACCEPTED)
        path.append(chosen)
        row = chosen


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


def _sample(p: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    if params.greedy:
        return int(p.argmax())
    return int(torch.multinomial(p / p.sum(), 1, generator=generator))


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens (longest n
    first) and propose what followed it. Free to run; good when the answer quotes its prompt."""

    name = SpecMethod.NGRAM

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


def verify_tree(drafts: list[int], parents: list[int], logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None, read_back: list[int] | None = None) -> TreeVerifyResult:
    """Verify a tree of drafts in one pass. Row 0 is the last known token, row i the draft drafts[i-1]
    whose parent row is parents[i-1]; logits (rows, vocab) predict the token after each row.

    Walking down from the root, the children of a row are tried in turn, each a deterministic proposal
    (q one-hot): accept child x with probability p(x) under what is left of p; on rejection set p(x) = 0
    and renormalize (the residual max(0, p - q)). The first accepted child becomes the row to continue
    from; when none is, sample from the residual. Each row's emitted token is then distributed exactly as
    p, so the text is distributed as the target's (greedy: p is one-hot, so this follows the argmax).
    Every decision is drawn on the device at once and read back in one copy (decide_on_device), or was
    read back with the step's tokens (`read_back`).
    """
    if read_back is None:
        read_back = to_host(decide_on_device(drafts, parents, logits, params, generator))
    return walk_decisions(drafts, parents, read_back, params.greedy)
