"""The knob table: every engine setting the app turns or checks, in one place, owned by the engine.

One row per knob: its type, the values it takes (a range or a list), its default, and whether reconfigure()
may change it between steps or only a new engine can. Read by EngineConfig's validation (engine/config.py),
reconfigure()'s (engine/commands.py), and in the app by the sliders, presets, cues and comparisons
(app/talk/knob_defaults.py); a knob is added here once. Torch-free: the GUI side reads it too.

`app_range`: the narrower range a preset, a cue or a slider offers (an engine built by code may go beyond:
a test's 1000 sequences, a GPU's 64k-token budget).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any

from engine.events import AttentionBackendName, KernelBuild, KvCacheDtype, SchedulingPolicy, SpecMethod
from engine.quant_formats import QUANT_BITS


@dataclass(frozen=True, slots=True)
class Knob:
    name: str  # the EngineConfig field
    type: type  # bool, int, float or str
    default: Any
    run_time: bool = False  # True: reconfigure() changes it between steps; False: fixed when the engine is built
    choices: tuple = ()  # the values it takes, where they are a list
    low: float | None = None  # the least value (numbers), inclusive unless low_exclusive
    high: float | None = None  # the largest value, inclusive
    low_exclusive: bool = False
    optional: bool = False  # None is a value too (off / automatic)
    none_spellings: tuple[str, ...] = ()  # strings the engine also reads as None (not offered to presets)
    app_range: tuple[int, int] | None = None  # what presets, cues and sliders offer, where narrower

    def problem(self, value: Any, *, app: bool = False) -> str | None:
        """What is wrong with `value` for this knob ("expected ..."), or None when it is fine. `app`: hold it
        to app_range as well (presets, cues)."""
        if self.optional and (value is None or (not app and value in self.none_spellings)):
            return None
        if self.choices:
            if value in self.choices and isinstance(value, bool) == isinstance(self.choices[0], bool):
                return None
            return f"expected one of {', '.join(repr(getattr(c, 'value', c)) for c in self.choices)}"
        if self.type is bool:
            return None if isinstance(value, bool) else "expected true or false"
        if self.type is str:
            return None if isinstance(value, str) else "expected a string"
        return self._number_problem(value, app)

    def _number_problem(self, value: Any, app: bool) -> str | None:
        low, high = self.app_range if app and self.app_range else (self.low, self.high)
        kind = "an integer" if self.type is int else "a number"
        exclusive = self.low_exclusive and not app  # app_range is inclusive at both ends
        ok = not isinstance(value, bool) and isinstance(value, numbers.Integral if self.type is int else numbers.Real)
        ok = ok and math.isfinite(value)
        if ok and low is not None:
            ok = value > low if exclusive else value >= low
        if ok and high is not None:
            ok = value <= high
        if ok:
            return None
        show = (lambda x: str(int(x))) if self.type is int else (lambda x: f"{x:g}")
        if low is not None and high is not None:
            rng = f"in {'(' if exclusive else '['}{show(low)}, {show(high)}]"
        elif low is not None:
            rng = f"> {show(low)}" if exclusive else f">= {show(low)}"
        else:
            rng = ""
        return f"expected {kind} {rng}".rstrip() + (" or none" if self.optional and not app else "")

    def check(self, value: Any, *, app: bool = False) -> Any:
        """`value` as the engine stores it when it is fine (a number as a plain int or float: a numpy
        integer or a Fraction is stored as one; a kind as its enum member, "ngram" as SpecMethod.NGRAM; a
        spelling of none as None); else ValueError naming the knob."""
        why = self.problem(value, app=app)
        if why:
            raise ValueError(f"{self.name}: {why}, got {value!r}")
        if value is None or (self.optional and value in self.none_spellings):
            return None
        if self.choices and isinstance(self.choices[0], Enum):
            return type(self.choices[0])(value)
        if self.type in (int, float) and not self.choices:
            return self.type(value)
        return value


_INT, _FLOAT, _BOOL, _STR = int, float, bool, str
KNOBS: tuple[Knob, ...] = (
    # scheduling (SchedulerConfig), all switched between steps
    Knob("max_num_seqs", _INT, 64, run_time=True, low=1, app_range=(1, 256)),
    Knob("max_num_batched_tokens", _INT, 512, run_time=True, low=1, app_range=(16, 8192)),
    Knob("enable_chunked_prefill", _BOOL, True, run_time=True),
    # which waiting request goes first (engine/core/policies.py)
    Knob("policy", _STR, SchedulingPolicy.FCFS, run_time=True, choices=tuple(SchedulingPolicy)),
    # while requests decode, prompt chunks are cut to keep a step within this many ms (engine/core/step_time.py)
    Knob("max_step_ms", _FLOAT, None, run_time=True, low=1, optional=True, app_range=(10, 2000)),
    # serve toward a latency budget (engine/core/scheduler.py): prompts that can still meet the TTFT budget go
    # first, shortest first; prompt chunks are cut so decoding requests keep their TPOT budget
    Knob("ttft_budget_ms", _FLOAT, None, run_time=True, low=1, optional=True, app_range=(50, 60000)),
    Knob("tpot_budget_ms", _FLOAT, None, run_time=True, low=1, optional=True, app_range=(5, 5000)),
    # admission control: None = off
    Knob("max_queue_len", _INT, None, run_time=True, low=0, optional=True),
    Knob("max_predicted_wait_s", _FLOAT, None, run_time=True, low=0, optional=True),
    # speculation: n-gram lookup switches between steps; a draft model or MTP heads need a new engine
    Knob("num_speculative_tokens", _INT, 0, run_time=True, low=0, high=8),
    Knob("spec_method", _STR, None, run_time=True, choices=tuple(SpecMethod), optional=True,
         none_spellings=("none",)),
    # execution paths switched between steps
    Knob("compile", _BOOL, False, run_time=True),
    Knob("fused_decode", _BOOL, True, run_time=True),
    Knob("int8_activations", _BOOL, True, run_time=True),
    # every bf16 step through the fused step, one order of sums per row whatever its company (engine/runner/fused.py)
    Knob("batch_invariant", _BOOL, True, run_time=True),
    # CUDA graphs for all-decode steps (engine/runner/graphs.py); None: on where the engine runs on CUDA
    Knob("cuda_graphs", _BOOL, None, run_time=True, optional=True),
    # fixed when the engine is built
    Knob("dtype", _STR, "auto", choices=("auto", "bfloat16", "float16", "float32")),
    Knob("attention_backend", _STR, AttentionBackendName.NATIVE, choices=tuple(AttentionBackendName)),
    Knob("kv_cache_dtype", _STR, KvCacheDtype.AUTO, choices=tuple(KvCacheDtype)),
    Knob("kernel_build", _STR, KernelBuild.WAIT, choices=tuple(KernelBuild)),
    Knob("gpu_memory_utilization", _FLOAT, 0.90, low=0.0, high=1.0, low_exclusive=True),
    Knob("num_kv_blocks", _INT, None, low=1, optional=True, app_range=(16, 1_000_000)),
    Knob("memory_budget_bytes", _INT, None, low=1, optional=True),
    Knob("enable_prefix_caching", _BOOL, True),
    Knob("pack_weights", _BOOL, False),
    Knob("quant_bits", _INT, 16, choices=QUANT_BITS),  # changed at run time by set_quantization, not reconfigure
    Knob("quant_group_size", _INT, 32, choices=(32, 64, 128)),
    Knob("max_loras", _INT, 0, low=0, app_range=(0, 64)),
    Knob("max_lora_rank", _INT, 16, low=1),
    Knob("max_cpu_loras", _INT, None, low=0, optional=True),
)
KNOB: Mapping[str, Knob] = MappingProxyType({k.name: k for k in KNOBS})
RECONFIGURABLE: tuple[str, ...] = tuple(k.name for k in KNOBS if k.run_time)  # what reconfigure() may change
# knobs whose values are a kind (an enum of engine/events.py): stored as the member, "ngram" as SpecMethod.NGRAM
KIND_KNOBS: tuple[str, ...] = tuple(k.name for k in KNOBS if k.choices and isinstance(k.choices[0], Enum))


def knob_default(name: str) -> Any:
    return KNOB[name].default


def check_knobs(values: Mapping[str, Any], *, app: bool = False) -> None:
    """ValueError for the first value in `values` (knob name -> value) its knob does not take; names not in
    the table are not checked here."""
    for name, value in values.items():
        knob = KNOB.get(name)
        if knob is not None:
            knob.check(value, app=app)
