"""What a step gives back (StepResult), and its one read-back: the sampled tokens, every verify row's
finiteness and every verify's decisions in one copy to the host (engine/models/layers/read_back.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.core.scheduler import ScheduledRequest
from engine.events import StepKind
from engine.models.layers.read_back import to_host
from engine.models.layers.sampler import SampleResult, noise_seed, sample
from engine.runner.fused import FusedDecode

NONFINITE = "the model produced non-finite logits (NaN or inf) for this request"


@dataclass(slots=True)
class StepResult:
    # The scheduled requests in the order they ran (decodes first) and, for those that reached the end
    # of their known tokens, the sampled token (None for a prefill chunk that stops short).
    order: list[ScheduledRequest]
    sampled: list[int | None]
    logprobs: list[tuple[float, list[tuple[int, float]]] | None]
    activation_bytes: int
    verify_logits: dict[int, torch.Tensor] = field(default_factory=dict)  # order index -> (n, vocab)
    # With keep_hidden: order index -> final hidden states of the rows that produce tokens ((1, hidden)
    # for a sampled token, (n, hidden) for a verify run), which multi-token prediction heads read.
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    # order index -> why that request failed this step (non-finite logits); it produced nothing
    failed: dict[int, str] = field(default_factory=dict)
    # order index -> a verify's decisions (greedy: each row's argmax; sampling: its acceptances and residual
    # samples; engine/spec/verify.py decide_on_device), read back with the sampled tokens
    verify_host: dict[int, list[int]] = field(default_factory=dict)


def producing_rows(order: list[ScheduledRequest]) -> tuple[list[int], list, list]:
    """The flat batch's rows that produce tokens: the last position of each request that reaches its end;
    every position of a verify run (one per draft token, plus the bonus position). Returns (those rows,
    [(request, its index among them)], [(verify, its first index among them, its rows)])."""
    if all(s.kind == StepKind.DECODE for s in order):  # the steady state: a decode's one token is its last
        n = len(order)
        return list(range(n)), list(zip(order, range(n))), []
    rows, producers, verify_spans = [], [], []
    offset = 0
    for s in order:
        offset += s.num_tokens
        if s.kind == StepKind.VERIFY:
            verify_spans.append((s, len(rows), s.num_tokens))
            rows.extend(range(offset - s.num_tokens, offset))
        elif s.request.num_computed_tokens + s.num_tokens == s.request.num_tokens:
            producers.append((s, len(rows)))
            rows.append(offset - 1)
    return rows, producers, verify_spans


def read_back_step(logits: torch.Tensor, producers: list, verify_spans: list, greedy,
                   decide, kernels=None, native=None) -> tuple[SampleResult | None, list[int], list[int]]:
    """Sample the producers' rows and read, in the same one copy back to the host (to_host), every verify
    row's finiteness then each verify's decisions (`decide`, the speculative decoder's hook: greedy, the
    argmax of each row; sampling, its acceptances and residual samples, drawn on the device): a step waits
    for the device once, however many requests it samples and verifies. `kernels`: the CUDA path's Triton
    kernels sample the producers' rows (engine/models/layers/sampler.py); `native`: the CPU's native module
    takes their greedy tokens and finiteness (ModelRunner.rows_kernel). Returns (the sampling result or
    None, [bad per verify row..., then every verify's decisions], the decisions' length per verify). Without
    `decide` a greedy verify reads its rows' argmax and a sampling one nothing (it decides on its own).
    (The CPU's fused step takes each row's argmax on its own: its greedy rows and greedy verifies need no
    torch op here; a sampling verify reads its rows a second time, which costs nothing on the CPU.)"""
    extra, sizes = None, []
    host = _greedy_verifies(greedy, verify_spans)
    if host is not None:  # the fused step's argmax already holds every decision
        host, sizes = host
        verify_spans = []
    if verify_spans:
        verify_rows = logits[[first + j for _, first, n in verify_spans for j in range(n)]]
        finite = torch.isfinite(verify_rows).all(dim=-1)
        clean = torch.where(finite.unsqueeze(1), verify_rows, 0.0)  # a failed row's draws stay defined
        parts, at = [(~finite).long()], 0
        for s, _, n in verify_spans:
            rows = clean[at : at + n]
            at += n
            part = decide(s, rows) if decide is not None else \
                rows.argmax(dim=-1) if s.request.sampling_params.greedy else rows.new_zeros(0, dtype=torch.long)
            parts.append(part.long())
            sizes.append(part.shape[0])
        extra = torch.cat(parts)
    result = None
    if producers:
        result = FusedDecode.greedy_result(greedy, producers)
        if result is None:
            rows = [r for _, r in producers]
            picked = logits if rows == list(range(logits.shape[0])) else logits[rows]  # every row: no copy
            seeds = [noise_seed(s.request.seed, s.request.num_tokens) for s, _ in producers] if kernels else None
            result = sample(picked, [s.request.sampling_params for s, _ in producers],
                            [s.request.generator for s, _ in producers], extra=extra, kernels=kernels, seeds=seeds,
                            native=native)
            return result, host if host is not None else result.extra, sizes
    if host is not None:
        return result, host, sizes
    return result, to_host(extra) if extra is not None else [], sizes


def _greedy_verifies(greedy: list[int | None] | None, verify_spans: list) -> tuple[list[int], list[int]] | None:
    """read_back_step's host list and sizes for verifies that are all greedy, straight from the fused
    step's greedy tokens (its argmax, None where a row is not finite), with no torch op: a flag per verify
    row, then each row's argmax (a greedy verify's decisions, decide_on_device). None: not all greedy, or
    no fused step."""
    if greedy is None or not verify_spans or any(not s.request.sampling_params.greedy for s, _, _ in verify_spans):
        return None
    rows = [greedy[first + j] for _, first, n in verify_spans for j in range(n)]
    return [int(t is None) for t in rows] + [0 if t is None else t for t in rows], [n for _, _, n in verify_spans]


def take_verifies(step: StepResult, where: dict, logits: torch.Tensor, verify_spans: list,
                  verify_host: list[int], sizes: list[int]) -> None:
    """Each verify's logits and read-back decisions into the step's result, or its failure when one of
    its rows was not finite (verify_host: a flag per verify row, then the decisions, sizes long each)."""
    num_verify_rows = sum(n for _, _, n in verify_spans)
    rows_at, at = 0, num_verify_rows
    for (s, first, n), size in zip(verify_spans, sizes):
        i = where[id(s)]
        if any(verify_host[rows_at : rows_at + n]):
            step.failed[i] = NONFINITE
        else:
            step.verify_logits[i] = logits[first : first + n]
            if size:
                step.verify_host[i] = verify_host[at : at + size]
        rows_at, at = rows_at + n, at + size
