"""Measured speed of a configuration: total tokens/s and tokens/s per user, from engine step events.

Time is the engine's busy time: each step counts until the next step starts, unless the engine went
idle in between (gap > IDLE_GAP_S), in which case only its own wall time counts. So a light load does
not make a configuration look slow, and the numbers are the engine's, not the arrival process's.

    tokens/s per user = decode tokens / sum over steps (decoding requests x step interval)
                        (1 / the mean time between two tokens of one running request)
    total tokens/s    = generated tokens / busy time
"""
from __future__ import annotations

from engine.events import EngineStepEvent, TradeoffPoint
from engine.quant_formats import DENSE

IDLE_GAP_S = 0.25


class RateMeter:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.generated_tokens = 0
        self.decode_tokens = 0
        self.busy_s = 0.0
        self._decode_time = 0.0  # sum of (decoding requests x interval)
        self._last: tuple[float, float, int] | None = None  # (t_start, wall, decoding requests)

    def add(self, event: EngineStepEvent) -> None:
        s = event.stats
        self.generated_tokens += sum(len(o.new_token_ids) for o in event.outputs)
        self.decode_tokens += s.num_decode_tokens
        self._close_last(s.t_start)
        self._last = (s.t_start, s.wall_time_s, s.num_decode_tokens)

    def _close_last(self, t_next: float | None) -> None:
        if self._last is None:
            return
        t0, wall, decoding = self._last
        interval = wall if t_next is None or t_next - t0 > wall + IDLE_GAP_S else t_next - t0
        self.busy_s += interval
        self._decode_time += decoding * interval
        self._last = None

    def _totals(self) -> tuple[float, float]:
        busy, decode_time = self.busy_s, self._decode_time
        if self._last is not None:  # the latest step counts with its own wall time
            busy += self._last[1]
            decode_time += self._last[2] * self._last[1]
        return busy, decode_time

    @property
    def busy_seconds(self) -> float:
        return self._totals()[0]

    def total_tokens_per_s(self) -> float | None:
        busy, _ = self._totals()
        return self.generated_tokens / busy if busy > 0 and self.generated_tokens else None

    def tokens_per_s_per_user(self) -> float | None:
        _, decode_time = self._totals()
        return self.decode_tokens / decode_time if decode_time > 0 and self.decode_tokens else None


def config_label(config: dict) -> str:
    """A short, stable label for a configuration point."""
    parts = [f"batch {config.get('max_num_seqs', '?')}", f"budget {config.get('max_num_batched_tokens', '?')}"]
    if config.get("quant_format", DENSE) != DENSE:
        parts.append(str(config["quant_format"]))
    if config.get("num_speculative_tokens", 0):
        parts.append(f"k={config['num_speculative_tokens']}")
    if config.get("compile"):
        parts.append("compiled")
    if "arrival_rate" in config:
        parts.append(f"{config['arrival_rate']:g} req/s")
    return " · ".join(parts)


def perplexity_delta_pct(perplexity: dict[str, float], fmt: str) -> float | None:
    """Perplexity change vs the 16-bit weights in %, when both were measured (never guessed)."""
    if fmt not in perplexity or DENSE not in perplexity:
        return None
    return (perplexity[fmt] / perplexity[DENSE] - 1.0) * 100.0


def make_point(label: str, config: dict, meter: RateMeter,
               perplexity: dict[str, float] | None = None) -> TradeoffPoint | None:
    total, per_user = meter.total_tokens_per_s(), meter.tokens_per_s_per_user()
    if total is None or per_user is None:
        return None
    delta = perplexity_delta_pct(perplexity or {}, str(config.get("quant_format", DENSE)))
    return TradeoffPoint(label=label, config=dict(config), tokens_per_s_per_user=per_user,
                         total_tokens_per_s=total, perplexity_delta_pct=delta)


class TradeoffMeter:
    """The live configuration's point: published once it has run for `min_seconds` of engine time."""

    def __init__(self, min_seconds: float = 5.0, update_every_s: float = 1.0) -> None:
        self.min_seconds = min_seconds
        self._update_every = update_every_s
        self._meter = RateMeter()
        self._config: dict = {}
        self._label: str | None = None
        self._last_publish = 0.0
        self.paused = False
        self.perplexity: dict[str, float] = {}  # weight format -> measured perplexity (from the engine)

    @property
    def label(self) -> str | None:
        return self._label

    def set_config(self, config: dict) -> None:
        """A new configuration starts a new measurement (an earlier point of the same label stays)."""
        label = config_label(config)
        if label != self._label:
            self._meter.reset()
            self._last_publish = 0.0
        self._config, self._label = dict(config), label

    def add(self, event: EngineStepEvent) -> TradeoffPoint | None:
        """Feed a step; returns an updated point when there is one to publish."""
        if self.paused or self._label is None:
            return None
        self._meter.add(event)
        busy = self._meter.busy_seconds
        if busy < self.min_seconds or busy - self._last_publish < self._update_every:
            return None
        self._last_publish = busy
        return make_point(self._label, self._config, self._meter, self.perplexity)

    def restart(self) -> None:
        self._meter.reset()
        self._last_publish = 0.0
