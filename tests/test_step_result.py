"""A step's one read-back (engine/runner/step_result.py): greedy verifies on the fused step take their
decisions from its argmax, with the same result as the torch ops over the logits."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from engine.runner.step_result import read_back_step
from engine.sampling_params import SamplingParams


def scheduled(temperature: float = 0.0):
    params = SamplingParams(temperature=temperature, max_tokens=4)
    return SimpleNamespace(request=SimpleNamespace(sampling_params=params, generator=None))


def greedy_of(logits: torch.Tensor) -> list[int | None]:
    """What the fused step hands back: each row's argmax, None where a logit is not finite."""
    return [int(row.argmax()) if bool(torch.isfinite(row).all()) else None for row in logits]


def test_greedy_verifies_read_the_fused_argmax_as_the_torch_ops_would():
    torch.manual_seed(0)
    logits = torch.randn(7, 50)
    logits[4, 3] = float("nan")  # the second verify's middle row: that verify fails
    a, b, decode = scheduled(), scheduled(), scheduled()
    spans = [(a, 0, 3), (b, 3, 3)]
    producers = [(decode, 6)]
    want = read_back_step(logits, producers, spans, None, None)  # the torch ops (no fused step)
    got = read_back_step(logits, producers, spans, greedy_of(logits), None)
    assert got[1] == want[1] and got[2] == want[2] == [3, 3]
    assert got[1][:6] == [0, 0, 0, 0, 1, 0]  # a flag per verify row, then the decisions
    assert got[1][6:9] == logits[:3].argmax(-1).tolist()
    assert got[0].token_ids == want[0].token_ids == [int(logits[6].argmax())]


def test_a_sampling_verify_still_decides_through_the_hook():
    logits = torch.randn(3, 20)
    seen = []

    def decide(s, rows):
        seen.append(rows.shape[0])
        return torch.tensor([1, 2, 3, 4, 5])

    out = read_back_step(logits, [], [(scheduled(0.8), 0, 3)], greedy_of(logits), decide)
    assert seen == [3] and out[1] == [0, 0, 0, 1, 2, 3, 4, 5] and out[2] == [5]
