"""Scheduling policies: FCFS, shortest-prompt-first with aging (no starvation), priority."""
from __future__ import annotations

from collections import deque

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.policies import FCFS, POLICIES, PriorityFirst, ShortestPromptFirst, make_policy
from engine.core.request import Request, RequestStatus


def req(rid: str, n_tokens: int, arrival: float, priority: int = 0) -> Request:
    return Request(rid, list(range(1, n_tokens + 1)), SamplingParams(max_tokens=4), arrival_time=arrival,
                   priority=priority)


def test_make_policy_names():
    assert set(POLICIES) == {"fcfs", "spf", "priority"}
    assert isinstance(make_policy("spf"), ShortestPromptFirst)
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        make_policy("lifo")
    with pytest.raises(ValueError, match="starvation"):
        ShortestPromptFirst(aging_tokens_per_s=0)


def test_fcfs_takes_the_head():
    q = deque([req("a", 500, 0.0), req("b", 5, 1.0)])
    assert FCFS().pick(q, 2.0).request_id == "a"


def test_spf_prefers_short_prompts_then_ages():
    spf = ShortestPromptFirst(aging_tokens_per_s=100.0)
    q = deque([req("long", 500, 0.0), req("short", 20, 0.0), req("mid", 100, 0.0)])
    assert spf.pick(q, 0.0).request_id == "short"
    q = deque([req("long", 500, 0.0), req("fresh-short", 20, 10.0)])
    assert spf.pick(q, 10.0).request_id == "long"  # 500 - 100*10 < 20: it has waited long enough
    # remaining tokens count, not the prompt: a preempted request's output must be recomputed too
    a = req("a", 10, 0.0)
    a.output_token_ids = list(range(50))
    assert spf.pick(deque([a, req("b", 30, 0.0)]), 0.0).request_id == "b"


def test_spf_preempted_request_goes_first():
    long = req("long", 500, 0.0)
    long.status = RequestStatus.PREEMPTED
    assert ShortestPromptFirst().pick(deque([long, req("short", 5, 0.0)]), 0.0) is long


@pytest.mark.parametrize("arrivals_per_service", [1, 2, 3])
def test_spf_aging_serves_a_long_prompt_under_a_constant_stream_of_short_ones(arrivals_per_service):
    """One request served every 0.1 s while short prompts keep arriving (as fast as served, or faster).
    Without aging the long prompt would wait for ever. With it, a short prompt beats it only if it arrived
    less than (L - S) / rate seconds after it, so it waits at most for those: bounded, no starvation."""
    rate, long_len, short_len, dt = 256.0, 1000, 20, 0.1
    spf = ShortestPromptFirst(aging_tokens_per_s=rate)
    waiting = deque([req("long", long_len, 0.0)])
    t, served_at, n = 0.0, None, 0
    while t < 60.0 and served_at is None:
        for _ in range(arrivals_per_service):
            waiting.append(req(f"s{n}", short_len, t))
            n += 1
        chosen = spf.pick(waiting, t)
        waiting.remove(chosen)
        if chosen.request_id == "long":
            served_at = t
        t += dt
    window = (long_len - short_len) / rate  # shorts arriving within this window after it may go first
    ahead = arrivals_per_service * (window / dt + 1)  # at most this many, one served per tick
    assert served_at is not None and served_at > 1.0  # short prompts did go first for a while ...
    assert served_at <= (ahead + 1) * dt  # ... but the long one was served within the aging bound
    assert arrivals_per_service == 1 or len(waiting) > 10  # while shorts were still queueing


def test_priority_then_fcfs_and_preempted_first_within_a_priority():
    p = PriorityFirst()
    q = deque([req("low-old", 5, 0.0, priority=5), req("hi-late", 5, 3.0, priority=-1),
               req("hi-early", 5, 1.0, priority=-1), req("mid", 5, 0.5, priority=0)])
    order = []
    while q:
        r = p.pick(q, 10.0)
        q.remove(r)
        order.append(r.request_id)
    assert order == ["hi-early", "hi-late", "mid", "low-old"]
    pre = req("pre", 5, 2.0)
    pre.status = RequestStatus.PREEMPTED
    assert p.pick(deque([pre, req("early", 5, 0.0)]), 3.0) is pre
    assert p.pick(deque([pre, req("urgent", 5, 0.0, priority=-3)]), 3.0).request_id == "urgent"


def _first_token_order(engine: LLMEngine) -> list[str]:
    order: list[str] = []
    while engine.has_unfinished():
        for out in engine.step():
            if out.new_token_ids and out.request_id not in order:
                order.append(out.request_id)
    return order


def test_engine_uses_the_policy(tiny_llama):
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=128, block_size=4,
                                 max_num_seqs=1, policy="priority"))
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    for rid, prio in (("c", 2), ("a", 0), ("b", 1)):
        eng.add_request([5, 6, 7, 8], params, request_id=rid, priority=prio)
    assert _first_token_order(eng) == ["a", "b", "c"]
    eng.reconfigure(policy="spf")
    for rid, n in (("long", 60), ("short", 3), ("mid", 20)):
        eng.add_request(list(range(10, 10 + n)), params, request_id=rid)
    assert _first_token_order(eng) == ["short", "mid", "long"]
