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


def taught(s, intercept=0.05, per_row=0.001):
    """Steps on the line t = intercept + per_row * rows, as the engine reports them after each step."""
    for rows in (100, 300, 500, 200, 400):
        s.observe(rows, rows, intercept + per_row * rows)


def test_step_time_model_fits_the_line_of_the_steps_it_saw():
    from engine.core.step_time import MIN_CHUNK_TOKENS, StepTimeModel

    m = StepTimeModel()
    assert m.prompt_tokens_within(0.15, 8, 512) == 512  # nothing seen: the budget alone
    m.observe(300, 0.35)
    m.observe(300, 0.35)
    assert m.line() is None  # one step size: no slope yet
    for rows in (100, 500):
        m.observe(rows, 0.05 + 0.001 * rows)
    intercept, slope = m.line()
    assert abs(intercept - 0.05) < 1e-6 and abs(slope - 0.001) < 1e-9
    assert m.prompt_tokens_within(0.15, 8, 512) == 92  # (0.15 - 0.05) / 0.001 - 8 decode rows
    assert m.prompt_tokens_within(0.02, 8, 512) == MIN_CHUNK_TOKENS  # a prompt always advances
    assert m.prompt_tokens_within(5.0, 8, 512) == 512  # never above the token budget
    assert abs(m.line()[0] + m.line()[1] * 200 - 0.25) < 1e-6  # 200 rows predicted
    for bad in (float("inf"), float("nan"), -1.0, 0.0):
        m.observe(100, bad)  # ignored: one bad reading must not poison the line for good
    assert abs(m.line()[0] + m.line()[1] * 200 - 0.25) < 1e-6


def test_step_time_model_follows_a_machine_that_gets_slower():
    from engine.core.step_time import StepTimeModel

    m = StepTimeModel()
    for _ in range(10):
        for rows in (100, 500):
            m.observe(rows, 0.05 + 0.001 * rows)
    for _ in range(40):  # another process took a core: every step now costs twice as much
        for rows in (100, 500):
            m.observe(rows, 2 * (0.05 + 0.001 * rows))
    assert abs(m.line()[1] - 0.002) < 1e-4


def test_max_step_ms_cuts_prompt_chunks_only_while_requests_decode():
    s = make(num_blocks=512, max_num_batched_tokens=512, max_step_ms=150)
    taught(s)  # here a step costs 50 ms + 1 ms per row
    s.add(req("a", 3))
    s.add(req("b", 3))
    advance(s, s.schedule())  # a and b now decode
    s.add(req("doc", 600))
    out = s.schedule()
    got = [(x.request.request_id, x.num_tokens, x.kind) for x in out.scheduled]
    assert got == [("a", 1, "decode"), ("b", 1, "decode"), ("doc", 98, "prefill")]  # (150 - 50) / 1 - 2 rows
    advance(s, out)
    out = s.schedule()  # the running doc's next chunk is cut the same way
    assert [(x.request.request_id, x.num_tokens) for x in out.scheduled] == [("a", 1), ("b", 1), ("doc", 98)]
    # nobody decodes: the whole budget goes to the prompt
    s2 = make(num_blocks=512, max_num_batched_tokens=512, max_step_ms=150)
    taught(s2)
    s2.add(req("doc", 600))
    assert [x.num_tokens for x in s2.schedule().scheduled] == [512]


def test_without_max_step_ms_or_chunking_the_token_budget_alone_decides():
    for kw in ({}, {"max_step_ms": 150, "enable_chunked_prefill": False}):
        s = make(num_blocks=512, max_num_batched_tokens=512, **kw)
        taught(s)
        s.add(req("a", 3))
        advance(s, s.schedule())
        s.add(req("doc", 400))
        got = [(x.request.request_id, x.num_tokens) for x in s.schedule().scheduled]
        assert got == [("a", 1), ("doc", 400)], kw
