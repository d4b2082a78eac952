"""Scheduler on counts only: token budget, chunked prefill, decode priority, preemption."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.sampling_params import SamplingParams


def req(rid, n):
    return Request(rid, list(range(n)), SamplingParams(max_tokens=8))


def advance(sched, out):
    """Pretend the model ran: computed counts catch up, finished prompts get one output token."""
    for s in out.scheduled:
        r = s.request
        r.num_computed_tokens += s.num_tokens
        if r.num_computed_tokens == r.num_tokens:
            r.output_token_ids.append(1)


def make(num_blocks=64, **kw):
    cfg = EngineConfig(block_size=4, **kw)
    return Scheduler(SchedulerConfig.of(cfg), BlockManager(num_blocks, 4, enable_prefix_caching=False))


def test_token_budget_and_chunked_prefill():
    s = make(max_num_batched_tokens=10)
    s.add(req("long", 25))
    s.add(req("short", 3))
    out = s.schedule()
    assert [(x.request.request_id, x.num_tokens, x.kind) for x in out.scheduled] == [("long", 10, "prefill")]
    advance(s, out)
    out = s.schedule()
    assert [(x.request.request_id, x.num_tokens) for x in out.scheduled] == [("long", 10)]
    advance(s, out)
    out = s.schedule()  # the last 5 tokens of long, then short fits in the rest of the budget
    assert [(x.request.request_id, x.num_tokens) for x in out.scheduled] == [("long", 5), ("short", 3)]


def test_running_decodes_go_before_a_new_long_prompt():
    s = make(max_num_batched_tokens=8)
    s.add(req("a", 3))
    s.add(req("b", 3))
    advance(s, s.schedule())
    s.add(req("doc", 40))
    out = s.schedule()
    got = [(x.request.request_id, x.num_tokens, x.kind) for x in out.scheduled]
    assert got == [("a", 1, "decode"), ("b", 1, "decode"), ("doc", 6, "prefill")]


def test_unchunked_prefill_waits_for_room():
    s = make(max_num_batched_tokens=8, enable_chunked_prefill=False)
    s.add(req("a", 3))
    advance(s, s.schedule())
    s.add(req("doc", 10))
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["a"]
    assert s.waiting[0].request_id == "doc"


def test_preemption_requeues_newest_at_front():
    s = make(num_blocks=4, max_num_batched_tokens=64)
    s.add(req("a", 7))  # 2 blocks
    s.add(req("b", 7))  # 2 blocks
    advance(s, s.schedule())
    s.schedule()  # both grow to 8 tokens within their blocks
    a, b = s.running
    a.num_computed_tokens, b.num_computed_tokens = 8, 8
    a.output_token_ids.append(1)
    b.output_token_ids.append(1)
    out = s.schedule()  # a needs a 3rd block: b is preempted
    assert [r.request_id for r in out.preempted] == ["b"]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert s.waiting[0] is b and b.num_preemptions == 1
    assert [x.request.request_id for x in out.scheduled] == ["a"]


def test_max_num_seqs():
    s = make(max_num_seqs=2)
    for i in range(4):
        s.add(req(f"r{i}", 2))
    out = s.schedule()
    assert len(out.scheduled) == 2 and len(s.waiting) == 2
