"""How one configuration runs the planned workload on its own engine: continuously scheduled, in
static batches, or without a KV cache (recomputing the whole prefix for every token).

Latency counts from each request's planned arrival (t0 + its arrival time), not from the moment it
was handed to the engine: a request due during a long step, or held back for the next static batch,
was already waiting."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from app.talk.compare.collect import RunRecord
from app.talk.compare.kinds import RunMode
from app.talk.compare.workload import PlannedRequest
from engine.drive import drive
from engine.events import RequestTimeline
from engine.sampling_params import SamplingParams


class Cancelled(Exception):
    """The comparison was cancelled; the engine's requests were aborted."""


def _params(p: PlannedRequest, stop: tuple[str, ...], max_tokens: int | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens or p.max_tokens, temperature=0.0, ignore_eos=True, seed=p.seed,
                          stop=list(stop))


class Driver:
    """Runs planned requests on `engine`, recording into `rec` through the engine's own listener."""

    def __init__(self, engine, rec: RunRecord, cancelled: Callable[[], bool], tag: str,
                 stop: tuple[str, ...] = (), loras: tuple[str, ...] = ()) -> None:
        """loras: adapter names the planned requests take in turn (request i: loras[i % len]); (): base."""
        self.engine, self.rec, self.cancelled, self.tag, self.stop = engine, rec, cancelled, tag, stop
        self.loras = loras
        self.t0 = 0.0
        self.due: dict[str, float] = {}  # request id -> planned arrival (perf_counter)

    def run(self, mode: RunMode, planned: list[PlannedRequest], rate: float) -> None:
        self.engine.add_listener(self.rec.on_event)
        try:
            self.t0 = self.rec.t_start = time.perf_counter()
            if mode == RunMode.RECOMPUTE:
                self._recompute(planned, rate)
            else:
                self._scheduled(planned, rate, static=mode == RunMode.STATIC)
            self.rec.t_end = time.perf_counter()
        finally:
            self.engine.remove_listener(self.rec.on_event)
        # keep the planned requests only (recompute's one-token requests are its means, not its subjects)
        self.rec.timelines = [replace(t, arrival=self.due[t.request_id]) for t in self.rec.timelines
                              if t.request_id in self.due]
        self.rec.token_ids = {k: v for k, v in self.rec.token_ids.items() if k in self.due}

    def _rid(self, p: PlannedRequest) -> str:
        return f"{self.tag}-{p.index}"

    def _submit(self, p: PlannedRequest, rate: float) -> None:
        lora = self.loras[p.index % len(self.loras)] if self.loras else None
        rid = self.engine.add_request(list(p.prompt_token_ids), _params(p, self.stop), request_id=self._rid(p),
                                      lora_name=lora)
        self.due[rid] = self.t0 + p.at_s(rate)
        self.rec.on_arrival(rid, len(p.prompt_token_ids))

    def _check_cancel(self) -> None:
        if self.cancelled():
            for rid in self.due:
                self.engine.abort(rid)
            drive(self.engine)
            raise Cancelled()

    def _scheduled(self, planned: list[PlannedRequest], rate: float, static: bool) -> None:
        """Continuous: every request goes in when it is due. Static: a batch of up to max_num_seqs of the
        requests that are due goes in only when the engine has nothing left of the previous one."""
        pending = deque(planned)
        batch = self.engine.config.max_num_seqs

        def submit_due() -> None:
            self._check_cancel()
            now = time.perf_counter() - self.t0
            if static:
                if not self.engine.has_unfinished():
                    n = 0
                    while pending and pending[0].at_s(rate) <= now and n < batch:
                        self._submit(pending.popleft(), rate)
                        n += 1
            else:
                while pending and pending[0].at_s(rate) <= now:
                    self._submit(pending.popleft(), rate)

        def until_next_due() -> float:
            return min(0.05, pending[0].at_s(rate) - (time.perf_counter() - self.t0)) if pending else 0.0

        drive(self.engine, until=lambda: not pending and not self.engine.has_unfinished(), before_step=submit_due,
              idle_wait=until_next_due)

    def _recompute(self, planned: list[PlannedRequest], rate: float) -> None:
        """No KV cache kept between tokens: each next token comes from a fresh one-token request over the
        prompt plus every token generated so far (the engine must run with the prefix cache off). The
        requests that are due step together, as the continuous run batches them."""
        pending = deque(planned)
        active: dict[str, list] = {}  # original id -> [planned, generated ids, first scheduled, first token]
        rounds = 0
        while pending or active:
            self._check_cancel()
            now = time.perf_counter() - self.t0
            while pending and pending[0].at_s(rate) <= now:
                p = pending.popleft()
                active[self._rid(p)] = [p, [], None, None]
                self.due[self._rid(p)] = self.t0 + p.at_s(rate)
            if not active:
                time.sleep(max(0.0, min(0.05, pending[0].at_s(rate) - now)))
                continue
            sub = {}
            for rid, (p, gen, _, _) in active.items():
                ids = list(p.prompt_token_ids) + gen
                sub[self.engine.add_request(ids, _params(p, (), 1), request_id=f"{rid}-r{rounds}")] = rid
                self.rec.extra_computed_tokens += len(gen)
            rounds += 1
            done: dict[str, int] = {}

            def collect(outputs, sub=sub, done=done) -> None:
                done.update((sub[o.request_id], o.token_ids[0]) for o in outputs if o.finished and o.request_id in sub)

            drive(self.engine, until=lambda sub=sub, done=done: len(done) >= len(sub), on_outputs=collect)
            self._after_round(active, done)

    def _after_round(self, active: dict, done: dict[str, int]) -> None:
        now = time.perf_counter()
        for rid, token in done.items():
            entry = active[rid]
            entry[1].append(token)
            if entry[3] is None:
                entry[2] = entry[2] or self.due[rid]
                entry[3] = now
            p = entry[0]
            if len(entry[1]) >= p.max_tokens:
                self.rec.token_ids[rid] = tuple(entry[1])
                self.rec.timelines.append(RequestTimeline(
                    rid, self.due[rid], len(p.prompt_token_ids), first_scheduled=entry[2], first_token=entry[3],
                    finished=now, num_output_tokens=len(entry[1]), finish_reason="length"))
                del active[rid]
