"""Iteration-level scheduling on counts only (no tensors).

Every step the scheduler hands out ``{request: num_scheduled_tokens}`` under a token budget. Running
requests go first (decodes cost one token each, so a long prompt never stalls them); the rest of the
budget admits waiting requests, a chunk of a long prompt at a time when chunked prefill is on. When the
KV cache runs out of blocks, the most recently admitted running request is preempted: its blocks are
freed and it is requeued at the front, to be recomputed later (nothing it produced is lost). With
`max_step_ms`, a step that carries decodes carries only as many prompt tokens as keep it within that time
(engine/core/step_time.py: a line fitted on the steps run so far, fed by `observe`).

Serving toward a latency budget (`ttft_budget_ms`, `tpot_budget_ms`; goodput counts only the requests that
meet both):
- TTFT: prompt work (prompts mid-prefill and waiting ones alike) goes first to the prompts that can still
  reach their first token within the budget, shortest first: a short chat is not queued behind a document
  that will be late anyway. A prompt that cannot make it any more waits behind them, the oldest of those
  still advancing a chunk each step (LATE_CHUNK_TOKENS, at most a quarter of the prompt tokens), so none
  starves.
- TPOT: a decoding request meets the budget when its mean time between tokens does. Each step may take
  what the decoding requests have saved by running ahead of TPOT_MARGIN x the budget. A fast decode-only
  step saves the rest of the budget for a later prompt chunk: the scheduler runs plain decode steps until a
  chunk worth its step's fixed cost fits, not a small chunk every step. A request whose first token came
  later than the TTFT budget, or one that cannot meet the TPOT budget any more even if every step from now
  on were a plain decode, no longer holds the others back.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from engine.config import SchedulerConfig  # held by EngineConfig; the scheduler gets it whole
from engine.core.block_manager import BlockManager
from engine.core.policies import Policy, make_policy
from engine.core.request import Request, RequestStatus
from engine.core.step_time import StepTimeModel
from engine.events import StepKind

TPOT_MARGIN = 0.85  # steps are sized for this share of the TPOT budget: the stream to the client takes some too
LATE_CHUNK_TOKENS = 32  # prompt tokens a step gives the oldest late prompt while others can still be on time


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_tokens: int  # tokens to run this step, starting at request.num_computed_tokens
    kind: StepKind  # prefill, decode or verify (the last token + draft tokens)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)

    def token_counts(self) -> tuple[int, int, int]:
        """(prefill, decode, verify) tokens scheduled, in one pass."""
        counts = {StepKind.PREFILL: 0, StepKind.DECODE: 0, StepKind.VERIFY: 0}
        for s in self.scheduled:
            counts[s.kind] += s.num_tokens
        return counts[StepKind.PREFILL], counts[StepKind.DECODE], counts[StepKind.VERIFY]

    @property
    def num_prefill_tokens(self) -> int:
        return self.token_counts()[0]

    @property
    def num_decode_tokens(self) -> int:
        return self.token_counts()[1]

    @property
    def num_verify_tokens(self) -> int:
        return self.token_counts()[2]

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, policy: Policy | None = None):
        self.config = config
        self.block_manager = block_manager
        self.policy = policy or make_policy(config.policy)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0  # cumulative
        self.step_time = StepTimeModel()  # what a step carrying prompt tokens costs here (max_step_ms)
        self.decode_time = StepTimeModel()  # what a step of decodes alone costs (its own path: the TPOT budget)
        # the clock the latency budgets, the policies' aging and the first-scheduled times read (the engine's
        # perf_counter; a test gives a logical one, so that what is scheduled depends on the steps alone)
        self.clock = time.perf_counter

    def reconfigure(self, config: SchedulerConfig, policy: Policy | None = None) -> None:
        """New knobs for the next schedule(); a new policy object when one is given."""
        self.config = config
        if policy is not None:
            self.policy = policy

    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, request: Request) -> None:
        """Take a request out of the queues and give back its blocks (finish, abort, error)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.block_manager.free(request.request_id)

    def forget_step_times(self) -> None:
        """Start both step-time lines afresh: what steps cost was learned on another machine state (the engine's
        thread count changed), and a line fitted across both would mislead the budgets for ~20-40 steps."""
        self.step_time, self.decode_time = StepTimeModel(), StepTimeModel()

    def observe(self, prompt_tokens: int, rows: int, seconds: float) -> None:
        """A step ran `rows` rows in `seconds`; the steps carrying prompt tokens teach the step-time line, the
        others the decode-only one."""
        (self.step_time if prompt_tokens > 0 else self.decode_time).observe(rows, seconds)

    def prompt_budget(self, now: float | None = None, prompt_work: int | None = None) -> int:
        """Prompt tokens this step may carry: the token budget, cut while requests decode by max_step_ms and
        by what the decoding requests' TPOT budget leaves (`prompt_work`: the prompt tokens waiting to run,
        when known)."""
        budget = self.config.max_num_batched_tokens
        cfg = self.config
        if (cfg.max_step_ms is None and cfg.tpot_budget_ms is None) or not cfg.enable_chunked_prefill:
            return budget
        decoding = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1 and not r.in_prompt]
        if not decoding:
            return budget
        max_step = None if cfg.max_step_ms is None else cfg.max_step_ms / 1000
        if cfg.tpot_budget_ms is not None:
            allowed = self._tpot_allowance(decoding, self.clock() if now is None else now)
            if allowed is not None and (max_step is None or allowed < max_step):
                return self._tpot_chunk(allowed, len(decoding), min(budget, prompt_work or budget))
        if max_step is None:
            return budget
        return self.step_time.prompt_tokens_within(max_step, len(decoding), budget)

    def _tpot_chunk(self, allowed: float, decode_rows: int, wanted: int) -> int:
        """Prompt tokens for a step of at most `allowed` seconds beside `decode_rows` decodes, or 0 when that
        chunk is too small to be worth a step: a chunk's rows should cost at least twice the step's fixed
        part (the weights read once per layer, the small ops), else plain decode steps run instead, each
        saving the decoding requests time for a bigger chunk soon (slack grows every plain step)."""
        intercept, slope = self.step_time.line()  # known: _tpot_allowance needs it
        n = self.step_time.prompt_tokens_within(allowed, decode_rows, wanted, min_chunk=0)
        worth = math.ceil(2 * intercept / slope) if slope > 0 else 0
        return n if n >= min(worth, wanted) else 0

    def _prompt_work(self) -> int:
        """Prompt tokens waiting to run: the rest of the running prompts and the waiting requests' tokens."""
        return (sum(r.num_tokens - r.num_computed_tokens for r in self.running if r.in_prompt)
                + sum(r.num_tokens - r.num_computed_tokens for r in self.waiting))

    def _tpot_allowance(self, decoding: list[Request], now: float) -> float | None:
        """Seconds the next step may take with every decoding request that can still meet the TPOT budget
        on budget after it; None when no request constrains it (or before the step time is known)."""
        plain = self.decode_time.predict(len(decoding))  # a step of these decodes alone
        if self.step_time.line() is None or plain is None:
            return None
        per_token = self.config.tpot_budget_ms / 1000 * TPOT_MARGIN
        if plain >= per_token:
            return None  # the batch alone misses the budget: holding prompts back would not help
        ttft = None if self.config.ttft_budget_ms is None else self.config.ttft_budget_ms / 1000
        allowed = None
        for r in decoding:
            if r.first_token_time is None:
                continue
            if ttft is not None and r.first_token_time - r.arrival_time > ttft:
                continue  # its first token came late: it is out of the budget already and holds nobody back
            gaps, elapsed = r.num_output_tokens - 1, now - r.first_token_time
            left = max(0, r.sampling_params.max_tokens - r.num_output_tokens)
            if (gaps + left) * per_token - elapsed - left * plain < 0:
                continue  # late even if every step from now on were a plain decode: it holds nobody back
            mine = (gaps + 1) * per_token - elapsed
            allowed = mine if allowed is None else min(allowed, mine)
        return allowed

    def schedule(self) -> SchedulerOutput:
        now = self.clock()
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        prompt_budget = self.prompt_budget(now, self._prompt_work() if self.config.tpot_budget_ms else None)
        triage = self.config.ttft_budget_ms is not None and self.config.enable_chunked_prefill
        prompting: list[Request] = []  # with a TTFT budget: running prompts, ordered with the waiting ones
        # 1. Running requests: decodes and unfinished prefill chunks, oldest first.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            pending = req.num_tokens - req.num_computed_tokens
            in_prompt = pending > 1 or req.in_prompt
            if triage and in_prompt:
                prompting.append(req)
                i += 1
                continue
            n = min(pending + (len(req.spec_token_ids) if pending == 1 else 0), budget,
                    prompt_budget if in_prompt else budget)
            if n <= 0:
                i += 1
                continue
            if not self._reserve(req, n, out):
                # No blocks left even after preempting everyone behind it: preempt it too.
                self._preempt(req, out)
                continue
            if pending == 1 and n > 1:  # the last token plus n - 1 draft tokens, checked in one pass
                del req.spec_token_ids[n - 1 :]
                kind = StepKind.VERIFY
            else:
                req.spec_token_ids.clear()
                kind = StepKind.DECODE if pending == 1 and not req.in_prompt else StepKind.PREFILL
            out.scheduled.append(ScheduledRequest(req, n, kind))
            budget -= n
            if kind == StepKind.PREFILL:
                prompt_budget -= n
            i += 1
        if triage:
            self._serve_prompts(prompting, budget, prompt_budget, now, out)
        # 2. Waiting requests, unless this step already had to preempt (memory is tight).
        elif not out.preempted:
            self._admit(min(budget, prompt_budget), out)
        return out

    def _serve_prompts(self, prompting: list[Request], budget: int, prompt_budget: int, now: float,
                       out: SchedulerOutput) -> None:
        """Prompt work under a TTFT budget: running prompts and waiting ones (these unless this step had to
        preempt) in one order. Preempted requests first; then the prompts that can still reach their first
        token in time, fewest tokens left first; then the late ones, oldest first. While on-time prompts
        wait, the oldest late one goes before them with a small chunk (LATE_CHUNK_TOKENS, at most a quarter
        of the step's prompt tokens): it advances every step, however many on-time prompts keep arriving."""
        fit = self.step_time.line()
        per_row = fit[1] if fit else 0.0
        deadline = self.config.ttft_budget_ms / 1000

        def left(r: Request) -> int:
            return r.num_tokens - r.num_computed_tokens

        def late(r: Request) -> bool:
            return r.first_token_time is None and now - r.arrival_time + left(r) * per_row > deadline

        first, on_time, behind = [], [], []
        for r in prompting + ([] if out.preempted else list(self.waiting)):
            (first if r.status is RequestStatus.PREEMPTED else behind if late(r) else on_time).append(r)
        on_time.sort(key=lambda r: (left(r), r.arrival_time))
        behind.sort(key=lambda r: r.arrival_time)
        order = first + behind[:1] + on_time + behind[1:] if on_time and behind else first + on_time + behind
        capped = behind[0] if on_time and behind else None
        adapters = {r.lora_id for r in self.running if r.lora_id}
        admissible = self._admissible(adapters)
        admitting = True
        for req in order:
            admitting = admitting and not out.preempted  # memory is tight: no admissions after a preemption
            room = min(budget, prompt_budget, max(1, min(LATE_CHUNK_TOKENS, prompt_budget // 4)) if req is capped
                       else budget)
            if room <= 0:
                break
            if req.status is RequestStatus.RUNNING:  # (one preempted earlier in this loop is not: no admissions)
                n = min(left(req), room)
                if not self._reserve(req, n, out):
                    self._preempt(req, out)
                    continue
                req.spec_token_ids.clear()
                out.scheduled.append(ScheduledRequest(req, n, StepKind.PREFILL))
            else:
                if not admitting or len(self.running) >= self.config.max_num_seqs or req not in admissible:
                    continue
                n = self._admit_one(req, room, out)
                if n is None:
                    admitting = False  # out of blocks: wait for running requests to finish
                    continue
                if req.lora_id and req.lora_id not in adapters:
                    adapters.add(req.lora_id)
                    admissible = self._admissible(adapters)
            budget -= n
            prompt_budget -= n

    def _admissible(self, adapters: set[int]) -> list[Request] | deque[Request]:
        """The waiting requests that may join the batch: with the running batch's adapters already at
        max_loras distinct ones, only requests of those adapters (or of none); the rest wait for a slot.
        Fairness: a request waiting for a slot holds back the later arrivals of the running adapters, so
        those drain, a slot frees and it gets in (under steady traffic to the running adapters it would
        otherwise wait forever); requests of the base model need no slot and still join."""
        if len(adapters) < self.config.max_loras or not any(r.lora_id for r in self.waiting):
            return self.waiting
        blocked = [r.arrival_time for r in self.waiting if r.lora_id and r.lora_id not in adapters]
        if not blocked:
            return self.waiting
        first = min(blocked)
        return [r for r in self.waiting
                if not r.lora_id or (r.lora_id in adapters and r.arrival_time <= first)]

    def _admit(self, budget: int, out: SchedulerOutput) -> None:
        adapters = {r.lora_id for r in self.running if r.lora_id}
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            candidates = self._admissible(adapters)
            if not candidates:
                break
            req = self.policy.pick(candidates, self.clock())
            n = self._admit_one(req, budget, out)
            if n is None:
                break  # out of blocks, or (unchunked) the prompt waits for a step with room
            if req.lora_id:
                adapters.add(req.lora_id)
            budget -= n

    def _admit_one(self, req: Request, budget: int, out: SchedulerOutput) -> int | None:
        """Admit a waiting request with up to `budget` of its tokens this step; the tokens scheduled, or None
        when it cannot start: no blocks left, or (unchunked) its prompt does not fit this step."""
        bm = self.block_manager
        tokens = req.all_token_ids
        cached = len(bm.cached_prefix(tokens, req.lora_id)) * bm.block_size
        remaining = req.num_tokens - cached
        if self.config.enable_chunked_prefill:
            n = min(remaining, budget)
        elif remaining <= budget or budget == self.config.max_num_batched_tokens:
            n = remaining  # unchunked: the whole prompt at once, alone if it exceeds the budget
        else:
            return None  # the prompt waits for a step with room: the traffic jam chunking avoids
        num_cached = bm.allocate(req.request_id, tokens, cached + n, lora_id=req.lora_id)
        if num_cached is None:
            return None
        self.waiting.remove(req)
        req.num_computed_tokens = num_cached
        if req.num_preemptions == 0:
            req.num_cached_tokens = num_cached
        req.status = RequestStatus.RUNNING
        if req.first_scheduled_time is None:
            req.first_scheduled_time = self.clock()
        self.running.append(req)
        # a prompt's tokens are a prefill however few are left (its last one after a prefix-cache hit):
        # they run on one path, so the K/V a prompt leaves do not depend on how it was split
        out.scheduled.append(ScheduledRequest(req, n, StepKind.PREFILL if remaining > 1 or req.in_prompt
                                              else StepKind.DECODE))
        return n

    def _reserve(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Ensure blocks for ``n`` more tokens of ``req``, preempting the newest others if needed."""
        while True:
            ok, copies = self.block_manager.ensure_slots(
                req.request_id, req.num_computed_tokens, req.num_computed_tokens + n
            )
            if ok:
                out.block_copies.extend(copies)
                return True
            victim = self.running[-1]
            if victim is req:
                return False
            self._preempt(victim, out)

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self.block_manager.free(req.request_id)
        req.num_computed_tokens = 0
        req.spec_token_ids.clear()
        req.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(req)
        self.num_preemptions += 1
        out.preempted.append(req)
        out.scheduled = [s for s in out.scheduled if s.request is not req]
