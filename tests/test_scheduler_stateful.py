"""A stateful property test of the scheduler and block manager together (issue 12, point 8): random
add / step / abort / drafts (speculative verify) / reconfigure, on a KV cache small enough that
preemption and prefix-cache eviction happen all the time, keep every invariant after every rule:

- a block is free xor referenced, and its ref count equals the number of block tables holding it;
- running and waiting are disjoint and hold exactly the unfinished requests; admitting keeps max_num_seqs;
- a running request's table covers its computed tokens; a waiting one holds no blocks;
- every request ends exactly once, and a drained engine holds no block.

The step emulates what LLMEngine does with a SchedulerOutput (computed counts catch up, a token per
finished prefill, accepted drafts, commit, truncate, finish) with no model: counts only, fast.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.core.block_manager import BlockManager
from engine.core.policies import POLICIES, make_policy
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.sampling_params import SamplingParams

BLOCK = 4
PREFIXES = ([], [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9])  # shared prefixes make prefix-cache hits


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(4, 12), budget=st.integers(1, 24), seqs=st.integers(1, 5),
                chunked=st.booleans(), policy=st.sampled_from(sorted(POLICIES)), caching=st.booleans(),
                step_ms=st.sampled_from([None, 1.0, 1000.0]), ttft_ms=st.sampled_from([None, 1.0, 1e7]),
                tpot_ms=st.sampled_from([None, 2.0, 1e6]))
    def setup(self, num_blocks, budget, seqs, chunked, policy, caching, step_ms, ttft_ms, tpot_ms):
        self.bm = BlockManager(num_blocks, BLOCK, enable_prefix_caching=caching)
        self.step_ms = step_ms
        # latency budgets: 1 ms of TTFT makes every prompt late, 1e7 none; 2 ms of TPOT holds prompts back
        # while requests decode on a tight budget, 1e6 ms lets whole chunks through
        self.sched = Scheduler(SchedulerConfig(seqs, budget, chunked, policy, max_step_ms=step_ms,
                                               ttft_budget_ms=ttft_ms, tpot_budget_ms=tpot_ms), self.bm)
        self.sched.step_time.min_chunk = 1  # chunks as small as one token: the budgets here are tiny
        # a logical clock, 1 ms a step, far later than the arrivals: what the budgets decide depends on the
        # steps alone, never on how fast a loaded machine runs the rules (hypothesis replays must draw alike)
        self.now = 1000.0
        self.sched.clock = lambda: self.now
        for rows in (2, 9, 17):  # a step-time line (1 ms + 0.1 ms per row) for max_step_ms to cut chunks by
            self.sched.observe(rows, rows, 0.001 + 0.0001 * rows)
        for rows in (1, 4):  # and one for decode-only steps (0.2 ms + 0.05 ms per row): the TPOT budget's
            self.sched.observe(0, rows, 0.0002 + 0.00005 * rows)
        self.capacity = num_blocks * BLOCK
        self.requests: dict[str, Request] = {}  # every request ever added
        self.ended: Counter[str] = Counter()
        self.next_id = 0
        self.steps_idle = 0

    # ---- rules ---------------------------------------------------------------------------------
    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(10, 40), min_size=0, max_size=16),
          max_tokens=st.integers(1, 12), priority=st.integers(-2, 2))
    def add(self, prefix, tail, max_tokens, priority):
        prompt = list(prefix) + tail or [11]
        if len(prompt) + max_tokens > self.capacity:  # add_request refuses these (context length)
            return
        rid = f"r{self.next_id}"
        self.next_id += 1
        # a logical arrival clock (1 ms apart): shortest-first's aging then orders the same way on every run,
        # however slowly a loaded machine runs the rules (hypothesis replays must draw the same data)
        req = Request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), priority=priority,
                      arrival_time=self.next_id * 1e-3)
        self.requests[rid] = req
        self.sched.add(req)

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def abort(self, data):
        req = data.draw(st.sampled_from(sorted(self.live(), key=lambda r: r.request_id)))
        event(f"aborted a {req.status.value} request")
        self.finish(req, RequestStatus.FINISHED_ABORTED)

    @precondition(lambda self: self.sched.running)
    @rule(data=st.data(), k=st.integers(1, 4))
    def propose_drafts(self, data, k):
        """Drafts for a request that is decoding: the next step verifies them in one pass. As many as the
        engine's speculative decoder would propose: the request's remaining tokens and the context (here
        the whole KV cache) leave room for, less the bonus token."""
        req = data.draw(st.sampled_from(self.sched.running))
        room = min(req.sampling_params.max_tokens - req.num_output_tokens, self.capacity - req.num_tokens) - 1
        if req.num_tokens - req.num_computed_tokens == 1 and room > 0:
            req.spec_token_ids = [30 + i for i in range(min(k, room))]

    @rule(seqs=st.integers(1, 5), budget=st.integers(1, 24), chunked=st.booleans(),
          policy=st.sampled_from(sorted(POLICIES)))
    def reconfigure(self, seqs, budget, chunked, policy):
        self.sched.reconfigure(replace(self.sched.config, max_num_seqs=seqs, max_num_batched_tokens=budget,
                                       enable_chunked_prefill=chunked, policy=policy),
                               make_policy(policy))

    @rule(data=st.data(), n=st.integers(1, 4))
    def step(self, data, n):
        for _ in range(n):
            self.one_step(data)

    def one_step(self, data):
        self.now += 1e-3
        before = {r.request_id for r in self.sched.running}
        out = self.sched.schedule()
        if {r.request_id for r in self.sched.running} - before:  # it admitted: within max_num_seqs
            # (a max_num_seqs lowered at run time stops admissions; it does not preempt who runs)
            assert len(self.sched.running) <= self.sched.config.max_num_seqs
        if out.preempted:
            event("a step preempted")
        if any(s.kind == "verify" for s in out.scheduled):
            event("a step verified drafts")
        if out.block_copies:
            event("a step copied a block (copy-on-write)")
        for req in out.preempted:
            assert req.status is RequestStatus.PREEMPTED and not self.bm.block_table(req.request_id)
        for s in out.scheduled:
            req = s.request
            assert s.num_tokens > 0 and req.num_computed_tokens + s.num_tokens <= req.num_tokens + len(
                req.spec_token_ids)
            assert len(self.bm.block_table(req.request_id)) * BLOCK >= req.num_computed_tokens + s.num_tokens
            if s.kind == "verify":
                accepted = data.draw(st.integers(0, s.num_tokens - 1), label="accepted drafts")
                drafts = req.spec_token_ids[:accepted]
                req.spec_token_ids.clear()
                req.num_computed_tokens += 1 + accepted
                for tok in drafts + [20]:  # the accepted drafts, then the corrected / bonus token
                    self.emit(req, tok)
                    if req.is_finished:
                        break
                if not req.is_finished:
                    self.bm.truncate(req.request_id, req.num_tokens)
                    self.bm.commit(req.request_id, req.all_token_ids, req.num_computed_tokens)
                continue
            req.num_computed_tokens += s.num_tokens
            self.bm.commit(req.request_id, req.all_token_ids, req.num_computed_tokens)
            if req.num_computed_tokens == req.num_tokens:
                self.emit(req, 10 + req.num_tokens % 7)
        if self.bm.num_cache_hit_blocks:
            event("the prefix cache was hit")
        self.steps_idle = 0 if out.scheduled else self.steps_idle + 1
        # while work is left, a step that schedules nothing must not repeat (it would be a livelock)
        assert self.steps_idle < 2 or not self.sched.has_unfinished()

    # ---- the engine's side of a step --------------------------------------------------------------
    def emit(self, req: Request, token: int) -> None:
        if req.first_token_time is None:
            req.first_token_time = self.now  # what the TPOT budget measures from (the logical clock)
        req.output_token_ids.append(token)
        if req.num_output_tokens >= req.sampling_params.max_tokens:
            self.finish(req, RequestStatus.FINISHED_LENGTH)

    def finish(self, req: Request, status: RequestStatus) -> None:
        assert not req.is_finished
        req.status = status
        self.sched.remove(req)
        self.ended[req.request_id] += 1

    def live(self) -> list[Request]:
        return [r for r in self.requests.values() if not r.is_finished]

    # ---- invariants ----------------------------------------------------------------------------
    @invariant()
    def blocks_free_xor_referenced(self):
        refs = [0] * self.bm.num_blocks
        for rid in self.requests:
            for b in self.bm.block_table(rid):
                refs[b] += 1
        assert refs == [self.bm.ref_count(b) for b in range(self.bm.num_blocks)]
        assert set(self.bm.free_block_order()) == {b for b, n in enumerate(refs) if n == 0}
        assert self.bm.num_used_blocks == sum(1 for n in refs if n)

    @invariant()
    def queues_hold_exactly_the_unfinished(self):
        running, waiting = self.sched.running, list(self.sched.waiting)
        ids = [r.request_id for r in running + waiting]
        assert len(ids) == len(set(ids))
        assert set(ids) == {r.request_id for r in self.live()}
        for r in running:
            assert r.status is RequestStatus.RUNNING
            assert len(self.bm.block_table(r.request_id)) * BLOCK >= r.num_computed_tokens
        for r in waiting:
            assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert not self.bm.block_table(r.request_id)

    @invariant()
    def each_request_ends_at_most_once(self):
        assert all(n == 1 for n in self.ended.values())
        assert set(self.ended) == {rid for rid, r in self.requests.items() if r.is_finished}

    def teardown(self):
        """Drain: every request ends exactly once, and no block stays referenced."""
        if not hasattr(self, "sched"):
            return
        self.sched.reconfigure(SchedulerConfig(4, 24, True, "fcfs"))
        for _ in range(2000):
            if not self.sched.has_unfinished():
                break
            out = self.sched.schedule()
            assert out.scheduled, "work left but nothing schedulable"
            for s in out.scheduled:
                req = s.request
                n = min(s.num_tokens, req.num_tokens - req.num_computed_tokens)  # drafts all rejected
                req.spec_token_ids.clear()
                req.num_computed_tokens += n
                if req.num_computed_tokens == req.num_tokens:
                    self.emit(req, 12)
                    if not req.is_finished:
                        self.bm.truncate(req.request_id, req.num_tokens)
        assert not self.sched.has_unfinished()
        assert set(self.ended) == set(self.requests) and all(n == 1 for n in self.ended.values())
        assert self.bm.num_used_blocks == 0


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=250, stateful_step_count=40, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
