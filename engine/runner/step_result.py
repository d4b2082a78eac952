"""What a step gives back (StepResult), and its one read-back: the sampled tokens, every verify row's
finiteness and every verify's decisions in one copy to the host (engine/models/layers/read_back.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.core.scheduler import ScheduledRequest
from engine.models.layers.read_back import to_host
from engine.models.layers.sampler import SampleResult, sample
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


def read_back_step(logits: torch.Tensor, producers: list, verify_spans: list, greedy,
                   decide) -> tuple[SampleResult | None, list[int], list[int]]:
    """Sample the producers' rows and read, in the same one copy back to the host (to_host), every verify
    row's finiteness then each verify's decisions (`decide`, the speculative decoder's hook: greedy, the
    argmax of each row; sampling, its acceptances and residual samples, drawn on the device): a step waits
    for the device once, however many requests it samples and verifies. Returns (the sampling result or
    None, [bad per verify row..., then every verify's decisions], the decisions' length per verify). Without
    `decide` a greedy verify reads its rows' argmax and a sampling one nothing (it decides on its own).
    (The CPU's fused step samples greedily on its own: there the verify rows are a second read, which
    costs nothing on the CPU.)"""
    extra, sizes = None, []
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
            result = sample(logits[[r for _, r in producers]], [s.request.sampling_params for s, _ in producers],
                            [s.request.generator for s, _ in producers], extra=extra)
            return result, result.extra, sizes
    return result, to_host(extra) if extra is not None else [], sizes


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
