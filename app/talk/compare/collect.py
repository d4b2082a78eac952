"""What one timed run saw, from its own engine's step events (never the live engine's listeners)."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.events import EngineStepEvent, RequestTimeline, StepKind, StepStats


@dataclass(slots=True)
class RunRecord:
    """Filled by `on_event` while a run steps; read by metrics.py afterwards."""

    kv_bytes_per_token: float = 0.0
    steps: list[StepStats] = field(default_factory=list)
    timelines: list[RequestTimeline] = field(default_factory=list)
    token_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)  # final output of each request
    context: dict[str, int] = field(default_factory=dict)  # request id -> tokens in its KV so far
    decode_kv_tokens: list[int] = field(default_factory=list)  # per decode-only step: context tokens read
    held_back_max: int = 0
    outputs_with_held_back: int = 0
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_emitted: int = 0
    spec_passes: int = 0
    t_start: float = 0.0
    t_end: float = 0.0
    extra_computed_tokens: int = 0  # recompute mode: prompt tokens that only re-derive earlier tokens
    # inter-token latency: for every step that gave a request tokens after its first, the time since the
    # step that gave it its previous ones (a stream frozen behind another request's prefill shows here)
    itl: list[float] = field(default_factory=list)
    last_token_at: dict[str, float] = field(default_factory=dict)

    def on_arrival(self, request_id: str, num_prompt_tokens: int) -> None:
        self.context[request_id] = num_prompt_tokens

    def on_event(self, ev: EngineStepEvent) -> None:
        s = ev.stats
        self.steps.append(s)
        if s.num_decode_tokens and not s.num_prefill_tokens and not s.num_verify_tokens:
            self.decode_kv_tokens.append(sum(self.context.get(rid, 0) for rid, _, kind in s.scheduled
                                             if kind == StepKind.DECODE))
        end = s.t_start + s.wall_time_s
        for out in ev.outputs:
            if out.request_id in self.context:
                self.context[out.request_id] += len(out.new_token_ids)
            if out.new_token_ids:
                last = self.last_token_at.get(out.request_id)
                if last is not None:
                    self.itl.append(end - last)
                self.last_token_at[out.request_id] = end
                if out.finished:
                    del self.last_token_at[out.request_id]
            if out.held_back_chars:
                self.outputs_with_held_back += 1
                self.held_back_max = max(self.held_back_max, out.held_back_chars)
            if out.finished:
                self.token_ids[out.request_id] = tuple(out.token_ids)
        self.timelines.extend(ev.finished)
        if ev.spec is not None:
            self.spec_drafted += ev.spec.num_draft_tokens
            self.spec_accepted += ev.spec.num_accepted_tokens
            self.spec_emitted += ev.spec.num_emitted_tokens
            self.spec_passes += ev.spec.num_verify_passes
