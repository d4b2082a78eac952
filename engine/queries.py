"""The engine's conveniences and read-only views: generate(), score(), stats(), memory(), block_map().
Mixed into LLMEngine; none of them changes what the scheduler will do next."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest
from engine.events import BlockMapSnapshot, MemorySnapshot, RequestOutput
from engine.runner.memory import snapshot
from engine.sampling_params import SamplingParams


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


class EngineQueries:
    """Needs from the engine: add_request, step, config, scheduler, block_manager, runner, model, device,
    weights_bytes, packed_bytes, block_bytes, max_model_len, spec_totals, spec_*_per_pos, _counts, _step, _ids."""

    def generate(self, prompts: str | Sequence[str] | Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run prompts to completion; returns the final RequestOutput of each, in input order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        plist = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(plist)} sampling params")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        final: dict[str, RequestOutput] = {}
        pending = set(ids)
        while pending:
            for out in self.step():
                if out.finished and out.request_id in pending:
                    final[out.request_id] = out
                    pending.discard(out.request_id)
        return [final[i] for i in ids]

    def score(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits (len(token_ids), vocab) float32 for every position of a text, computed fresh in
        temporary KV blocks (never taken from or added to the prefix cache). Call between steps."""
        with torch.inference_mode():
            return self.model.compute_logits(self.hidden_states(token_ids))

    @torch.inference_mode()
    def hidden_states(self, token_ids: Sequence[int]) -> torch.Tensor:
        """The final (normed) hidden states (len(token_ids), hidden) that the lm_head reads, computed as
        score() computes its logits."""
        ids = [int(t) for t in token_ids]
        if not 0 < len(ids) <= self.max_model_len:
            raise ValueError(f"score() takes 1 to {self.max_model_len} tokens, got {len(ids)}")
        rid = f"__score-{next(self._ids)}"
        if self.block_manager.allocate(rid, ids, len(ids), use_prefix_cache=False) is None:
            raise RuntimeError("not enough free KV blocks to score this text now")
        try:
            req = Request(rid, ids, SamplingParams(max_tokens=1))
            return self.runner.forward([ScheduledRequest(req, len(ids), "prefill")], self.block_manager)
        finally:
            self.block_manager.free(rid)

    def stats(self) -> EngineStats:
        c = self._counts
        return EngineStats(
            num_requests=c["requests"],
            num_finished=c["finished"],
            num_prompt_tokens=c["prompt"],
            num_generated_tokens=c["generated"],
            num_steps=self._step,
            num_prefix_cache_hit_tokens=c["cached"],
            num_preemptions=self.scheduler.num_preemptions,
            num_rejected=self._num_rejected,
            num_draft_tokens=self.spec_totals["draft"],
            num_accepted_tokens=self.spec_totals["accepted"],
            num_verify_passes=self.spec_totals["verify"],
            num_spec_emitted_tokens=self.spec_totals["emitted"],
            accepted_per_position=tuple(self.spec_accepted_per_pos),
            drafted_per_position=tuple(self.spec_drafted_per_pos),
        )

    def memory(self) -> MemorySnapshot:
        bm = self.block_manager
        return snapshot(self.device, self.weights_bytes, self.block_bytes, bm.num_blocks, bm.num_used_blocks,
                        bm.num_cached_free_blocks, self._last_activation_bytes, self.packed_bytes)

    def block_map(self) -> BlockMapSnapshot:
        return self.block_manager.snapshot()
