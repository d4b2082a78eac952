"""The engine's conveniences and read-only views: generate() (a loop over the public verbs), the scoring
forward pass behind score() and hidden_states(), the EngineStats that stats() returns and the StepStats
each step publishes. LLMEngine's
methods call these; none of them changes what the scheduler will do next."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.core.block_manager import BlockManager
from engine.core.counters import EngineCounters
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from engine.drive import drive
from engine.events import ForwardPath, RequestOutput, StepKind, StepStats
from engine.runner.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.spec.decoder import SpeculativeDecoder


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_requests: int
    num_finished: int
    num_prompt_tokens: int
    num_generated_tokens: int
    num_steps: int
    num_prefix_cache_hit_tokens: int
    num_preemptions: int
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_rejected: int = 0  # refused by admission control
    num_failed: int = 0  # finished with an error of their own (finish_reason "error")
    num_verify_passes: int = 0  # speculative: requests verified (one target pass each)
    num_spec_emitted_tokens: int = 0  # tokens those passes produced (accepted + corrected/bonus)
    accepted_per_position: tuple[int, ...] = ()
    drafted_per_position: tuple[int, ...] = ()

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def tokens_per_verify(self) -> float:
        return self.num_spec_emitted_tokens / self.num_verify_passes if self.num_verify_passes else 0.0


def generate(engine, prompts: str | Sequence[str] | Sequence[Sequence[int]],
             params: SamplingParams | Sequence[SamplingParams] | None = None,
             lora_names: Sequence[str | None] | None = None) -> list[RequestOutput]:
    """Run prompts to completion through engine.add_request / engine.step; the final RequestOutput of
    each, in input order. Safe from several threads at once."""
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    plist = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
    if len(plist) != len(prompts):
        raise ValueError(f"got {len(prompts)} prompts but {len(plist)} sampling params")
    loras = list(lora_names) if lora_names is not None else [None] * len(prompts)
    if len(loras) != len(prompts):
        raise ValueError(f"got {len(prompts)} prompts but {len(loras)} lora_names")
    # Finished outputs are taken from the step events, not from step()'s return: with generate() running in
    # several threads (or beside an engine loop), the step that finishes a request may be another caller's.
    finished: dict[str, RequestOutput] = {}

    def collect(event) -> None:
        finished.update((out.request_id, out) for out in event.outputs if out.finished)

    engine.add_listener(collect)
    try:
        ids = [engine.add_request(p, sp, lora_name=lo) if lo is not None else engine.add_request(p, sp)
               for p, sp, lo in zip(prompts, plist, loras)]
        # steps are serialised by the engine: one at a time, whichever thread calls it
        drive(engine, until=lambda: all(i in finished for i in ids))
    finally:
        engine.remove_listener(collect)
    return [finished[i] for i in ids]


@torch.inference_mode()
def fresh_hidden_states(runner: ModelRunner, block_manager: BlockManager, make_id: Callable[[], str],
                        token_ids: Sequence[int], max_model_len: int) -> torch.Tensor:
    """The final (normed) hidden states (len(token_ids), hidden) of a text, computed in temporary KV
    blocks (never taken from or added to the prefix cache) held under a fresh id. Call between steps."""
    return fresh_hidden_states_many(runner, block_manager, make_id, [token_ids], max_model_len)[0]


def fresh_hidden_states_many(runner: ModelRunner, block_manager: BlockManager, make_id: Callable[[], str],
                             texts: Sequence[Sequence[int]], max_model_len: int) -> list[torch.Tensor]:
    """fresh_hidden_states for several texts in one forward pass (one prefill batch: larger products, a
    little faster on a CPU than one text at a time); every text's blocks are given back."""
    texts = [[int(t) for t in ids] for ids in texts]
    for ids in texts:
        if not 0 < len(ids) <= max_model_len:
            raise ValueError(f"score() takes 1 to {max_model_len} tokens, got {len(ids)}")
    held, batch = [], []
    try:
        for ids in texts:
            request_id = make_id()
            if block_manager.allocate(request_id, ids, len(ids), use_prefix_cache=False) is None:
                raise RuntimeError("not enough free KV blocks to score this text now")
            held.append(request_id)
            batch.append(ScheduledRequest(Request(request_id, ids, SamplingParams(max_tokens=1)), len(ids),
                                          StepKind.PREFILL))
        hidden = runner.forward(batch, block_manager)
    finally:
        for request_id in held:
            block_manager.free(request_id)
    return list(hidden.split([len(ids) for ids in texts]))


def engine_stats(counters: EngineCounters, num_preemptions: int, num_rejected: int,
                 spec: SpeculativeDecoder) -> EngineStats:
    c = counters
    return EngineStats(
        num_requests=c.requests,
        num_finished=c.finished,
        num_prompt_tokens=c.prompt,
        num_generated_tokens=c.generated,
        num_steps=c.steps,
        num_prefix_cache_hit_tokens=c.cached,
        num_preemptions=num_preemptions,
        num_rejected=num_rejected,
        num_failed=counters.failed,
        num_draft_tokens=spec.totals["draft"],
        num_accepted_tokens=spec.totals["accepted"],
        num_verify_passes=spec.totals["verify"],
        num_spec_emitted_tokens=spec.totals["emitted"],
        accepted_per_position=tuple(spec.accepted_per_pos),
        drafted_per_position=tuple(spec.drafted_per_pos),
    )


def step_stats(step: int, t0: float, sched: SchedulerOutput, scheduler: Scheduler, bm: BlockManager,
               num_finished: int, num_rejected: int, num_failed: int = 0,
               cost: tuple[int, int] = (0, 0), forward_path: ForwardPath = ForwardPath.NONE) -> StepStats:
    """The counts of one step, its wall time measured from t0 to now, and its (FLOPs, bytes moved)
    counted from the shapes it ran (engine/perf/step_counter.py)."""
    prefill, decode, verify = sched.token_counts()
    return StepStats(
        step=step,
        t_start=t0,
        wall_time_s=time.perf_counter() - t0,
        num_prefill_tokens=prefill,
        num_decode_tokens=decode,
        num_verify_tokens=verify,
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        num_preempted=len(sched.preempted),
        kv_blocks_used=bm.num_used_blocks,
        kv_blocks_total=bm.num_blocks,
        num_finished=num_finished,
        num_rejected=num_rejected,
        num_failed=num_failed,
        scheduled=tuple((s.request.request_id, s.num_tokens, s.kind) for s in sched.scheduled),
        flops=cost[0], bytes_moved=cost[1],
        scheduled_loras=tuple(s.request.lora_name for s in sched.scheduled),
        forward_path=forward_path,
    )
