"""LoadGenerator: synthetic traffic from real text: Poisson arrivals, bursts of long prompts.

Pure Python (no torch), so the desktop app, the benchmarks and the server can all drive an engine with
it. The generator only decides *what* arrives *when*; the caller submits each `Arrival` to the engine:

    gen = LoadGenerator(LoadConfig(arrival_rate=4.0), tokenizer, rng_seed=0, max_model_len=2048)
    gen.start(time.perf_counter())
    ...
    for a in gen.due(time.perf_counter()):
        engine.add_request(a.prompt_token_ids, SamplingParams(**a.sampling))

Every prompt is a window of real text (assets/heldout.txt, or a built-in paragraph when it is
missing) tokenized by the engine's own tokenizer and cut to length, so prefill sees real token
statistics. With `shared_prefix_tokens` every prompt starts with the same "system prompt", which the
prefix cache turns into shared KV blocks.

Arrival processes are separate objects behind one small protocol (`next_time`, `pop`). Closed-loop
users (LoadConfig.num_users, app/load/closed_loop.py) are one of them: each waits for its answer,
thinks, then asks again, so the caller reports `on_submitted(request_id or None, arrival, now)` after
submitting and `on_finished(request_id, now)` when one of its requests ends.
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Protocol

from app.load.closed_loop import ClosedLoopUsers
from app.load.kinds import ArrivalKind
from engine.sampling_params import REQUEST_FIELDS, SamplingParams

_ASSET = Path(__file__).resolve().parents[2] / "assets" / "heldout.txt"
_FALLBACK = (
    "Inference engineering is the craft of turning a trained model into a fast, cheap and reliable service. "
    "A request arrives with a prompt. Prefill reads the whole prompt in one parallel pass and writes its keys "
    "and values into the KV cache; decode then writes one token per pass, reading every earlier key and value "
    "again. Prefill is limited by arithmetic, decode by memory bandwidth, so a server batches many decoding "
    "requests together and slips new prompts in between, one step at a time. The cache is cut into blocks of "
    "sixteen tokens, handed out like pages of virtual memory, shared when two prompts begin the same way and "
    "freed the moment a request ends. When memory runs short the scheduler pauses a request and recomputes it "
    "later. Every choice trades the speed one user sees against the number of users a machine can serve. "
)
MAX_CATCH_UP = 1000  # arrivals one due() call may return after a long stall


@dataclass(slots=True)
class LoadConfig:
    arrival_rate: float = 2.0  # Poisson arrivals per second; 0 turns them off
    prompt_tokens: tuple[int, int] = (32, 256)  # uniform range of the unique part of a prompt
    output_tokens: tuple[int, int] = (16, 128)  # uniform range of max_tokens
    burst_prompt_tokens: tuple[int, int] = (512, 1024)  # a burst's long prompts
    burst_output_tokens: tuple[int, int] = (16, 64)
    shared_prefix_tokens: int = 0  # a common "system prompt" in front of every prompt
    temperature: float = 0.8
    ignore_eos: bool = False  # True: every output runs to max_tokens (fixed work, for benchmarks)
    num_users: int = 0  # closed-loop users (app/load/closed_loop.py) on top of the Poisson arrivals; 0 = none
    think_time_s: float = 1.0  # a user's mean pause (exponential) between an answer and its next question
    # multi-LoRA: each arrival runs with one of these adapters, drawn uniformly ("base": the base model);
    # empty: every request on the base model
    lora_mix: tuple[str, ...] = ()
    # prompts are instructions (the generator's `instructions`, chat-formatted by the caller) instead of
    # windows of text: what fine-tuned adapters answer in their style
    instructions: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.arrival_rate, (int, float)) and math.isfinite(self.arrival_rate)
                and self.arrival_rate >= 0):
            raise ValueError(f"arrival_rate must be a number >= 0, got {self.arrival_rate!r}")
        for name in ("prompt_tokens", "output_tokens", "burst_prompt_tokens", "burst_output_tokens"):
            lo, hi = getattr(self, name)
            if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
                raise ValueError(f"{name} must be a range [lo, hi] of integers with 1 <= lo <= hi, got {[lo, hi]}")
            setattr(self, name, (lo, hi))
        if not isinstance(self.shared_prefix_tokens, int) or self.shared_prefix_tokens < 0:
            raise ValueError(f"shared_prefix_tokens must be an integer >= 0, got {self.shared_prefix_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        SamplingParams(**self.sampling())  # the engine's own range check of every field sent (ValueError)
        if not isinstance(self.num_users, int) or self.num_users < 0:
            raise ValueError(f"num_users must be an integer >= 0, got {self.num_users!r}")
        if not (math.isfinite(self.think_time_s) and self.think_time_s >= 0):
            raise ValueError(f"think_time_s must be a number >= 0, got {self.think_time_s!r}")
        if any(not isinstance(n, str) or not n for n in self.lora_mix):
            raise ValueError(f"lora_mix must be adapter names (or 'base'), got {list(self.lora_mix)!r}")
        self.lora_mix = tuple(self.lora_mix)


    def sampling(self) -> dict:
        """What every generated request samples with: the fields above that SamplingParams has too
        (SAMPLED_FIELDS: temperature, ignore_eos; a field added here by a SamplingParams name travels)."""
        return {name: getattr(self, name) for name in SAMPLED_FIELDS}


SAMPLED_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(LoadConfig) if f.name in REQUEST_FIELDS)


@dataclass(frozen=True, slots=True)
class Arrival:
    prompt_token_ids: list[int]
    sampling: dict = field(default_factory=dict)  # SamplingParams keyword arguments
    kind: ArrivalKind = ArrivalKind.POISSON
    due: float = 0.0  # when it was meant to arrive (perf_counter seconds)
    lora_name: str | None = None  # the adapter it runs with (LoadConfig.lora_mix); None: the base model


class ArrivalProcess(Protocol):
    """One source of arrivals. `next_time()` is when its next arrival is due (inf: none planned)."""

    def next_time(self) -> float: ...

    def pop(self) -> ArrivalKind:
        """Consume the due arrival; returns its kind. Only called when next_time() <= now."""


class PoissonProcess:
    """Exponential gaps at `rate` per second, from `start` on. first_at_start: the first arrival is due
    at `start` itself (a preset at a low rate shows a request at once instead of an empty screen for the
    first gap), the gaps after it are exponential."""

    def __init__(self, rng: random.Random, rate: float, start: float, first_at_start: bool = False) -> None:
        self._rng = rng
        self._rate = rate
        self._next = start if first_at_start and rate > 0 else start + self._gap()

    def _gap(self) -> float:
        return self._rng.expovariate(self._rate) if self._rate > 0 else math.inf

    def set_rate(self, rate: float, now: float) -> None:
        # memoryless: redrawing from now is exactly a Poisson process at the new rate
        self._rate = rate
        self._next = now + self._gap()

    def next_time(self) -> float:
        return self._next

    def pop(self) -> ArrivalKind:
        self._next += self._gap()
        return ArrivalKind.POISSON


class BurstQueue:
    """Long prompts that are due at once (a burst)."""

    def __init__(self) -> None:
        self._times: deque[float] = deque()

    def add(self, n: int, now: float) -> None:
        self._times.extend([now] * n)

    def next_time(self) -> float:
        return self._times[0] if self._times else math.inf

    def pop(self) -> ArrivalKind:
        self._times.popleft()
        return ArrivalKind.BURST


class LoadGenerator:
    def __init__(self, config: LoadConfig, tokenizer=None, rng_seed: int = 0, *, corpus_ids: list[int] | None = None,
                 max_model_len: int | None = None, instructions: list[list[int]] | None = None) -> None:
        """tokenizer: anything with encode(text, add_special_tokens=False) (or pass corpus_ids).
        max_model_len: prompt + max_tokens are cut to fit it. instructions: ready prompts (token ids,
        chat-formatted) drawn from when config.instructions is set."""
        if corpus_ids is None:
            if tokenizer is None:
                raise ValueError("LoadGenerator needs a tokenizer or corpus_ids")
            corpus_ids = tokenizer.encode(corpus_text(), add_special_tokens=False)
        if not corpus_ids:
            raise ValueError("the corpus is empty")
        self.config = config
        self._corpus = list(corpus_ids)
        self._rng = random.Random(rng_seed)
        self._max_len = max_model_len
        self._poisson: PoissonProcess | None = None
        self._bursts = BurstQueue()
        self._users: ClosedLoopUsers | None = None
        self._user_requests: set[str] = set()  # request ids of the users' questions in flight
        self._num_generated = 0
        self._instructions = [list(p) for p in instructions or () if p]

    # --- control ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._poisson is not None

    def start(self, now: float) -> None:
        """Start Poisson arrivals and closed-loop users (bursts are due whether or not it runs)."""
        self._poisson = PoissonProcess(self._rng, self.config.arrival_rate, now, first_at_start=True)
        self._users = ClosedLoopUsers(self._rng, self.config.num_users, self.config.think_time_s, now)

    def stop(self) -> None:
        self._poisson = None
        self._users = None
        self._user_requests.clear()

    def burst(self, n: int, now: float) -> None:
        """n long prompts, due now."""
        self._bursts.add(max(0, int(n)), now)

    def clear(self) -> None:
        """Drop pending bursts and stop arrivals."""
        self.stop()
        self._bursts = BurstQueue()

    def set_config(self, config: LoadConfig, now: float) -> None:
        self.config = config
        if self._poisson is not None:
            self._poisson.set_rate(config.arrival_rate, now)
        if self._users is not None:
            self._users.think_time_s = config.think_time_s
            self._users.set_users(config.num_users, now)

    def set_rate(self, arrival_rate: float, now: float) -> None:
        self.set_config(replace(self.config, arrival_rate=arrival_rate), now)

    def on_submitted(self, request_id: str | None, arrival: Arrival, now: float) -> None:
        """The caller submitted `arrival` as `request_id` (None: the engine refused it). Closed-loop
        users need it: a refused user thinks and asks again; an accepted one waits for on_finished."""
        if arrival.kind != ArrivalKind.USER or self._users is None:
            return
        if request_id is None:
            self._users.answered(now)
        else:
            self._user_requests.add(request_id)

    def on_finished(self, request_id: str, now: float) -> None:
        """A request of ours ended: if a closed-loop user asked it, that user thinks, then asks again."""
        if request_id in self._user_requests:
            self._user_requests.discard(request_id)
            if self._users is not None:
                self._users.answered(now)

    # --- arrivals -----------------------------------------------------------------------------
    def _processes(self) -> list[ArrivalProcess]:
        return [p for p in (self._poisson, self._bursts, self._users) if p is not None]

    def next_due(self) -> float:
        """perf_counter time of the next arrival (inf when nothing is planned)."""
        return min((p.next_time() for p in self._processes()), default=math.inf)

    def due(self, now: float) -> list[Arrival]:
        """Every arrival due by `now`, oldest first (several after a long engine step)."""
        out: list[Arrival] = []
        while len(out) < MAX_CATCH_UP:
            proc = min(self._processes(), key=lambda p: p.next_time(), default=None)
            if proc is None or proc.next_time() > now:
                break
            t = proc.next_time()
            out.append(self._make(proc.pop(), t))
        return out

    def make_arrival(self, kind: ArrivalKind = ArrivalKind.POISSON) -> Arrival:
        """One request drawn from the configured distributions (for fixed workloads, e.g. a sweep)."""
        return self._make(kind, 0.0)

    def _make(self, kind: ArrivalKind, t: float) -> Arrival:
        cfg = self.config
        long = kind == ArrivalKind.BURST
        n_out = self._rng.randint(*(cfg.burst_output_tokens if long else cfg.output_tokens))
        n_prompt = self._rng.randint(*(cfg.burst_prompt_tokens if long else cfg.prompt_tokens))
        prefix = self._text(0, cfg.shared_prefix_tokens)
        if self._max_len is not None:  # keep prompt + output inside the context
            n_out = max(1, min(n_out, self._max_len // 2))
            n_prompt = max(1, min(n_prompt, self._max_len - n_out - len(prefix)))
            prefix = prefix[: max(0, self._max_len - n_out - n_prompt)]
        if cfg.instructions and self._instructions and not long:
            body = self._rng.choice(self._instructions)[: max(1, (self._max_len or 1 << 30) - n_out)]
            prefix = []
        else:
            body = self._text(self._rng.randrange(len(self._corpus)), n_prompt)
        self._num_generated += 1
        sampling = {"max_tokens": n_out, **cfg.sampling(), "seed": self._rng.getrandbits(31)}
        lora = self._rng.choice(cfg.lora_mix) if cfg.lora_mix else "base"  # no draw without a mix
        return Arrival(prefix + body, sampling, kind, t, None if lora == "base" else lora)

    def _text(self, start: int, n: int) -> list[int]:
        """n corpus tokens from `start`, wrapping around."""
        c = self._corpus
        out: list[int] = []
        while len(out) < n:
            take = c[start: start + n - len(out)]
            out.extend(take)
            start = 0
        return out

    @property
    def num_generated(self) -> int:
        return self._num_generated

    @property
    def corpus_ids(self) -> list[int]:
        return self._corpus

    @property
    def instructions(self) -> list[list[int]]:
        return self._instructions


def corpus_text() -> str:
    """The held-out text (assets/heldout.txt) when present, else a built-in paragraph repeated."""
    try:
        text = _ASSET.read_text(encoding="utf-8")
    except OSError:
        text = ""
    return text if text.strip() else _FALLBACK * 40
