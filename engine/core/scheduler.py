"""Iteration-level scheduling on counts only (no tensors).

Every step the scheduler hands out ``{request: num_scheduled_tokens}`` under a token budget. Running
requests go first (decodes cost one token each, so a long prompt never stalls them); the rest of the
budget admits waiting requests, a chunk of a long prompt at a time when chunked prefill is on. When the
KV cache runs out of blocks, the most recently admitted running request is preempted: its blocks are
freed and it is requeued at the front, to be recomputed later (nothing it produced is lost). With
`max_step_ms`, a step that carries decodes carries only as many prompt tokens as keep it within that time
(engine/core/step_time.py: a line fitted on the steps run so far, fed by `observe`).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine.config import SchedulerConfig  # held by EngineConfig; the scheduler gets it whole
from engine.core.block_manager import BlockManager
from engine.core.policies import Policy, make_policy
from engine.core.request import Request, RequestStatus
from engine.core.step_time import StepTimeModel
from engine.events import StepKind


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

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled if s.kind == StepKind.PREFILL)

    @property
    def num_decode_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled if s.kind == StepKind.DECODE)

    @property
    def num_verify_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled if s.kind == StepKind.VERIFY)

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

    def observe(self, prompt_tokens: int, rows: int, seconds: float) -> None:
        """A step ran `rows` rows in `seconds`; the steps carrying prompt tokens teach the step-time line."""
        if prompt_tokens > 0:
            self.step_time.observe(rows, seconds)

    def prompt_budget(self) -> int:
        """Prompt tokens this step may carry: the token budget, cut by max_step_ms while requests decode."""
        budget = self.config.max_num_batched_tokens
        if self.config.max_step_ms is None or not self.config.enable_chunked_prefill:
            return budget
        decoding = sum(1 for r in self.running if r.num_tokens - r.num_computed_tokens == 1 and not r.in_prompt)
        if not decoding:
            return budget
        return self.step_time.prompt_tokens_within(self.config.max_step_ms / 1000, decoding, budget)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        prompt_budget = self.prompt_budget()
        scheduled_ids: set[str] = set()
        # 1. Running requests: decodes and unfinished prefill chunks, oldest first.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            pending = req.num_tokens - req.num_computed_tokens
            in_prompt = pending > 1 or req.in_prompt
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
            scheduled_ids.add(req.request_id)
            budget -= n
            if kind == StepKind.PREFILL:
                prompt_budget -= n
            i += 1
        # 2. Waiting requests, unless this step already had to preempt (memory is tight).
        if not out.preempted:
            self._admit(min(budget, prompt_budget), out)
        return out

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
        bm = self.block_manager
        adapters = {r.lora_id for r in self.running if r.lora_id}
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            candidates = self._admissible(adapters)
            if not candidates:
                break
            req = self.policy.pick(candidates, time.perf_counter())
            tokens = req.all_token_ids
            cached = len(bm.cached_prefix(tokens, req.lora_id)) * bm.block_size
            remaining = req.num_tokens - cached
            if self.config.enable_chunked_prefill:
                n = min(remaining, budget)
            elif remaining <= budget or budget == self.config.max_num_batched_tokens:
                n = remaining  # unchunked: the whole prompt at once, alone if it exceeds the budget
            else:
                break  # the prompt waits for a step with room: the traffic jam chunking avoids

            num_cached = bm.allocate(req.request_id, tokens, cached + n, lora_id=req.lora_id)
            if num_cached is None:
                break  # out of blocks: wait for running requests to finish
            self.waiting.remove(req)
            req.num_computed_tokens = num_cached
            if req.num_preemptions == 0:
                req.num_cached_tokens = num_cached
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.perf_counter()
            self.running.append(req)
            if req.lora_id:
                adapters.add(req.lora_id)
            # a prompt's tokens are a prefill however few are left (its last one after a prefix-cache hit):
            # they run on one path, so the K/V a prompt leaves do not depend on how it was split
            out.scheduled.append(ScheduledRequest(req, n, StepKind.PREFILL if remaining > 1 or req.in_prompt
                                                  else StepKind.DECODE))
            budget -= n

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
