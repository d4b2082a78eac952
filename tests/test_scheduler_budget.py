"""Serving toward a latency budget (SchedulerConfig.ttft_budget_ms / tpot_budget_ms), on counts only.

TTFT: prompts that can still make their first token in time go first, shortest first, ahead of late ones
(running or waiting alike); the oldest late prompt still advances a small chunk every step. TPOT: a step
may take what the decoding requests saved by running ahead of their budget; a chunk too small to be worth a
step's fixed cost waits for plain decode steps to save more.
"""
from __future__ import annotations

import time

import pytest

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.request import Request
from engine.core.scheduler import LATE_CHUNK_TOKENS, TPOT_MARGIN, Scheduler, SchedulerConfig
from engine.sampling_params import SamplingParams


def make(**kw):
    cfg = EngineConfig(block_size=4, **kw)
    s = Scheduler(SchedulerConfig.of(cfg), BlockManager(1024, 4, enable_prefix_caching=False))
    for rows in (100, 300, 500, 200, 400):  # a step carrying prompt tokens: 50 ms + 1 ms per row
        s.observe(rows, rows, 0.05 + 0.001 * rows)
    for rows in (1, 4, 8):  # a step of decodes alone: 9 ms + 1 ms per row
        s.observe(0, rows, 0.009 + 0.001 * rows)
    return s


def req(rid, n, *, waited=0.0, max_tokens=8):
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens),
                   arrival_time=time.perf_counter() - waited)


def run(s, out, now=None):
    """The model ran: counts catch up; a finished prompt gets its first token (at `now`)."""
    for x in out.scheduled:
        r = x.request
        r.num_computed_tokens += x.num_tokens
        if r.num_computed_tokens == r.num_tokens:
            r.output_token_ids.append(7)
            if r.first_token_time is None:
                r.first_token_time = time.perf_counter() if now is None else now


def got(out):
    return [(x.request.request_id, x.num_tokens) for x in out.scheduled]


def test_prompts_that_can_still_be_on_time_go_first_shortest_first():
    s = make(max_num_batched_tokens=200, ttft_budget_ms=1000)
    s.add(req("doc", 600))  # 600 rows at 1 ms: 0.6 s, on time while fresh
    s.add(req("chat", 40))
    s.add(req("hi", 10))
    assert got(s.schedule()) == [("hi", 10), ("chat", 40), ("doc", 150)]


def test_a_late_document_mid_prefill_waits_behind_fresh_chats_and_still_advances():
    s = make(max_num_batched_tokens=200, ttft_budget_ms=1000)
    doc = req("doc", 900, waited=0.5)  # 0.5 s waited + 0.9 s of prompt left: it cannot make 1 s any more
    s.add(doc)
    run(s, s.schedule())
    assert doc.num_computed_tokens == 200  # alone, it has the whole budget
    s.add(req("chat", 40))
    s.add(req("hi", 10))
    # the late doc gets its small chunk first (a quarter of the prompt tokens, at most LATE_CHUNK_TOKENS),
    # then the chats that can still be on time, then the doc again with what is left... once per step
    out = s.schedule()
    assert got(out) == [("doc", min(LATE_CHUNK_TOKENS, 200 // 4)), ("hi", 10), ("chat", 40)]
    run(s, out)
    assert got(s.schedule())[-1] == ("doc", 200 - 2)  # the chats decode (2 tokens); the doc takes the rest


def test_a_late_prompt_is_not_starved_by_a_stream_of_on_time_chats():
    s = make(max_num_batched_tokens=64, ttft_budget_ms=1000)
    doc = req("doc", 300, waited=5.0)
    s.add(doc)
    for i in range(200):
        s.add(req(f"chat{i}", 60))  # a new chat each step that alone could fill the budget
        run(s, s.schedule())
        if doc.num_output_tokens:
            break
    assert doc.num_output_tokens == 1 and i < 300 // (64 // 4) + 2


def test_a_fresh_decoder_holds_back_a_chunk_too_small_to_be_worth_a_step():
    s = make(max_num_batched_tokens=512, tpot_budget_ms=100)
    a = req("a", 3, max_tokens=40)
    s.add(a)
    run(s, s.schedule())  # a's first token just came: it has saved nothing yet
    s.add(req("doc", 600))
    # a may wait 85 ms for its next token: that fits (85 - 50) / 1 - 1 = 34 prompt rows, and a chunk is worth a
    # step at 2 x 50 / 1 = 100 rows: a plain decode step instead
    assert got(s.schedule()) == [("a", 1)]


def test_time_saved_by_plain_decode_steps_buys_a_big_chunk():
    s = make(max_num_batched_tokens=512, tpot_budget_ms=100)
    a = req("a", 3, max_tokens=40)
    s.add(a)
    run(s, s.schedule())
    a.output_token_ids += [7] * 4  # four more tokens, 10 ms apart: 4 x 75 ms saved
    a.num_computed_tokens = a.num_tokens - 1
    a.first_token_time = time.perf_counter() - 0.04
    s.add(req("doc", 600))
    out = s.schedule()
    allowed = 5 * 0.1 * TPOT_MARGIN - 0.04  # the next token of 5 gaps on budget
    assert got(out)[0] == ("a", 1) and out.scheduled[1].request.request_id == "doc"
    assert int((allowed - 0.05) / 0.001) - 1 - 3 <= out.scheduled[1].num_tokens <= int((allowed - 0.05) / 0.001) - 1


def test_a_small_prompt_is_not_held_for_a_chunk_it_could_never_fill():
    s = make(max_num_batched_tokens=512, tpot_budget_ms=100)
    a = req("a", 3, max_tokens=40)
    s.add(a)
    run(s, s.schedule())
    s.add(req("hi", 20))  # 20 rows fit the 34 a leaves: nothing to wait for
    assert got(s.schedule()) == [("a", 1), ("hi", 20)]


@pytest.mark.parametrize("why", ["late first token", "cannot catch up"])
def test_a_decoder_already_out_of_budget_holds_nobody_back(why):
    s = make(max_num_batched_tokens=512, tpot_budget_ms=100, ttft_budget_ms=1000)
    a = req("a", 3, max_tokens=6)
    s.add(a)
    run(s, s.schedule())
    if why == "late first token":
        a.arrival_time = a.first_token_time - 2.0  # its first token came 2 s after it arrived
    else:
        a.first_token_time -= 5.0  # 5 s for 0 gaps: even 5 more fast tokens cannot bring the mean to 100 ms
    s.add(req("doc", 600))
    assert got(s.schedule()) == [("a", 1), ("doc", 511)]  # the whole token budget, less a's decode


def test_without_budgets_the_scheduler_is_unchanged():
    s = make(max_num_batched_tokens=200)
    doc = req("doc", 900, waited=5.0)
    s.add(doc)
    run(s, s.schedule())
    s.add(req("chat", 40))
    assert got(s.schedule()) == [("doc", 200)]  # FCFS: the running prompt first, the chat waits


def test_budgets_are_checked_knobs():
    for bad in (0, -5, float("nan")):
        with pytest.raises(ValueError, match="ttft_budget_ms"):
            EngineConfig(ttft_budget_ms=bad)
        with pytest.raises(ValueError, match="tpot_budget_ms"):
            EngineConfig(tpot_budget_ms=bad)
    c = EngineConfig(ttft_budget_ms=1500, tpot_budget_ms=150)
    assert (c.scheduler.ttft_budget_ms, c.scheduler.tpot_budget_ms) == (1500, 150)
    assert c.knob_values()["tpot_budget_ms"] == 150


def test_serve_flags_and_the_peer_bench_tell_the_engine_the_budget():
    from app.bench.serve_peer import inferlab_server
    from app.cli import build_parser
    from app.server.serve import engine_config
    from engine.core.metrics import SLO

    args = build_parser().parse_args(["serve", "--model", "x.gguf", "--ttft-budget-ms", "1500",
                                      "--tpot-budget-ms", "150"])
    cfg = engine_config(args)
    assert (cfg.ttft_budget_ms, cfg.tpot_budget_ms) == (1500, 150)
    told = inferlab_server("m.gguf", 2, "", "auto", SLO(1.5, 0.15)).command
    assert told[told.index("--ttft-budget-ms") + 1] == "1500" and told[told.index("--tpot-budget-ms") + 1] == "150"
    assert "--ttft-budget-ms" not in inferlab_server("m.gguf", 2, "", "auto").command
