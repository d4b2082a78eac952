"""The knob table: every setting the app turns, checks or offers, in one place, owned by the engine.

One row per knob (napari's fields with a title and a description, vLLM's flags generated from its config are
the models): its type, the values it takes (a range or a list), its default, whether reconfigure() may change
it between steps, and how the app shows and offers it: a label, a sentence of help, a unit, slider stops,
which layer reads it (the engine's EngineConfig, the load generator, or `inferlab serve`), its command-line
flag and where it is offered (`uses`: presets, cues, comparisons, a managed server's restart, `serve`,
`generate`; `slider`: the Controls panel's box). EngineConfig's validation (engine/config.py), reconfigure()'s
(engine/validation.py), the controls panel (widgets/controls.py), presets, cues, comparisons, the command
lines (app/knob_args.py) and the managed servers' sliders read it: a new knob is a row here plus its use.
Torch-free (an import-linter contract): the GUI reads it too.

`app_range`: the narrower range a preset, a cue or a slider offers (an engine built by code may go beyond:
a test's 1000 sequences, a GPU's 64k-token budget).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, TypedDict, cast

from engine.events import AttentionBackendName, KernelBuild, KvCacheDtype, SchedulingPolicy, SpecMethod, StrEnum
from engine.knob_check import number_problem
from engine.quant_formats import DENSE, QUANT_FORMATS


class Layer(StrEnum):
    """Which part of the system reads a knob."""

    ENGINE = "engine"  # an EngineConfig (or SchedulerConfig) field
    LOAD = "load"  # the load generator's LoadConfig, or what each generated request samples with
    SERVER = "server"  # `inferlab serve`'s HTTP front (not the engine's config)


class Use(StrEnum):
    """Where the app offers a knob, beside its slider."""

    PRESET = "preset"  # a preset's [engine] (engine knobs) or [workload] (load knobs) key
    CUE = "cue"  # a cue's `set = {...}` (app/talk/cues.py)
    COMPARE = "compare"  # a [compare] configuration's knob (app/talk/compare/spec.py)
    RESTART = "restart"  # a managed server restarts with it (app/managed/knobs.py)
    SERVE = "serve"  # an `inferlab serve` flag (`flag`)
    GENERATE = "generate"  # an `inferlab generate` flag too


class Box(StrEnum):
    """The Controls panel's boxes, top to bottom."""

    ENGINE = "Engine"
    LOAD = "Load generator"
    BUDGET = "Latency budget"


@dataclass(frozen=True, slots=True)
class Knob:
    name: str  # the EngineConfig field (LoadConfig's for a load knob)
    type: type  # bool, int, float or str
    default: Any
    run_time: bool = False  # True: reconfigure() changes it between steps; False: fixed when the engine is built
    choices: tuple[Any, ...] = ()  # the values it takes, where they are a list
    low: float | None = None  # the least value (numbers), inclusive unless low_exclusive
    high: float | None = None  # the largest value, inclusive
    low_exclusive: bool = False
    optional: bool = False  # None is a value too (off / automatic)
    none_spellings: tuple[str, ...] = ()  # strings the engine also reads as None (not offered to presets)
    app_range: tuple[float, float] | None = None  # what presets, cues and sliders offer, where narrower
    # how the app shows and offers it
    label: str = ""  # a few words: the slider's title, the timeline's and messages' name for it
    help: str = ""  # one sentence: the slider's tooltip, the flag's --help
    unit: str = ""  # after a number: "tok", "req/s", "ms"
    digits: int = 0  # decimals shown for a float
    value_names: tuple[tuple[Any, str], ...] = ()  # values shown by a name: ((0, "off"),)
    stops: tuple[Any, ...] = ()  # the slider's positions, where it has one
    slider: Box | None = None  # the Controls panel's box it sits in (None: no slider)
    layer: Layer = Layer.ENGINE
    flag: str | None = None  # its command-line flag (Use.SERVE / Use.GENERATE)
    uses: frozenset[Use] = frozenset()
    needs: str | None = None  # the source's capability it needs (app/source/engine_info.py), where one

    def text(self, value: Any) -> str:
        """`value` as the app shows it: "64", "512 tok", "off", "int8 + row scales", "1.5 req/s"."""
        for known, name in self.value_names:
            if value == known and isinstance(value, bool) == isinstance(known, bool):
                return name
        if value is None:
            return "off"
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, float) and self.type is float:
            shown = f"{value:.{self.digits}f}"
        else:
            shown = str(getattr(value, "value", value))
        return f"{shown} {self.unit}" if self.unit else shown

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
        low, high = self.app_range if app and self.app_range else (self.low, self.high)
        return number_problem(value, self.type is int, low, high, self.low_exclusive and not app,
                              self.optional and not app)

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
_P, _C, _X, _R, _S, _G = Use.PRESET, Use.CUE, Use.COMPARE, Use.RESTART, Use.SERVE, Use.GENERATE
TOKEN_BUDGETS = (*range(16, 257, 16), *range(320, 1025, 64), *range(1280, 4097, 256))
_FORMAT_NAMES = tuple((f.name, f.short) for f in QUANT_FORMATS)  # the slider's few characters (the label: its tooltip)
KNOBS: tuple[Knob, ...] = (
    # scheduling (SchedulerConfig), all switched between steps
    Knob("max_num_seqs", _INT, 64, run_time=True, low=1, app_range=(1, 256), label="max batch size",
         help="requests in the running batch", stops=tuple(range(1, 257)), slider=Box.ENGINE, flag="--max-num-seqs",
         uses=frozenset({_P, _C, _X, _R, _S})),
    Knob("max_num_batched_tokens", _INT, 512, run_time=True, low=1, app_range=(16, 8192), label="token budget",
         help="tokens one step computes at most (prompt chunks and decodes together)", unit="tok",
         stops=TOKEN_BUDGETS, slider=Box.ENGINE, flag="--max-num-batched-tokens", uses=frozenset({_P, _C, _X, _S})),
    Knob("enable_chunked_prefill", _BOOL, True, run_time=True, label="chunked prefill",
         help="cut long prompts into chunks that share a step with the decodes", flag="--chunked-prefill",
         uses=frozenset({_P, _C, _X, _S})),
    # which waiting request goes first (engine/core/policies.py)
    Knob("policy", _STR, SchedulingPolicy.FCFS, run_time=True, choices=tuple(SchedulingPolicy), label="policy",
         help="which waiting request goes next", flag="--policy", uses=frozenset({_P, _C, _X, _S})),
    # while requests decode, prompt chunks are cut to keep a step within this many ms (engine/core/step_time.py)
    Knob("max_step_ms", _FLOAT, None, run_time=True, low=1, optional=True, app_range=(10, 2000), label="step time cap",
         help="while requests decode, cut prompt chunks so a step is predicted to stay within this", unit="ms",
         flag="--max-step-ms", uses=frozenset({_X, _S})),
    # serve toward a latency budget (engine/core/scheduler.py): prompts that can still meet the TTFT budget go
    # first, shortest first; prompt chunks are cut so decoding requests keep their TPOT budget
    Knob("ttft_budget_ms", _FLOAT, None, run_time=True, low=1, optional=True, app_range=(50, 60000),
         label="TTFT budget", help="serve toward this time to first token: prompts that can still make it go "
         "first, shortest first", unit="ms", stops=tuple(range(50, 5001, 50)), slider=Box.BUDGET,
         flag="--ttft-budget-ms", uses=frozenset({_X, _S})),
    Knob("tpot_budget_ms", _FLOAT, None, run_time=True, low=1, optional=True, app_range=(5, 5000),
         label="TPOT budget", help="serve toward this time per output token: prompt chunks are sized so every "
         "decoding request stays within it", unit="ms", stops=tuple(range(5, 501, 5)), slider=Box.BUDGET,
         flag="--tpot-budget-ms", uses=frozenset({_X, _S})),
    # admission control: None = off
    Knob("max_queue_len", _INT, None, run_time=True, low=0, optional=True, label="queue limit",
         help="refuse (429) beyond this many waiting requests", flag="--max-queue-len", uses=frozenset({_S})),
    Knob("max_predicted_wait_s", _FLOAT, None, run_time=True, low=0, optional=True, label="wait limit", unit="s",
         help="refuse (429) when the predicted queue wait exceeds this", flag="--max-predicted-wait",
         uses=frozenset({_S})),
    # speculation: n-gram lookup switches between steps; a draft model or MTP heads need a new engine
    Knob("num_speculative_tokens", _INT, 0, run_time=True, low=0, high=8, label="draft length", unit="tokens",
         help="tokens proposed per step and verified in one pass (0: no speculation)", value_names=((0, "off"),),
         stops=tuple(range(0, 9)), slider=Box.ENGINE, flag="--num-draft-tokens",
         uses=frozenset({_P, _C, _X, _R, _S, _G}), needs="speculative"),
    Knob("spec_method", _STR, None, run_time=True, choices=tuple(SpecMethod), optional=True, none_spellings=("none",),
         label="speculation", help="the proposer: n-gram lookup, a draft model (--draft-model) or MTP heads",
         flag="--spec-method", uses=frozenset({_P, _X, _S, _G}), needs="speculative"),
    # execution paths switched between steps
    Knob("compile", _BOOL, False, run_time=True, label="torch.compile",
         help="torch.compile each decode step (the first steps stall while it compiles)", flag="--compile",
         uses=frozenset({_P, _C, _X, _S})),
    Knob("fused_decode", _BOOL, True, run_time=True, label="fused decode", uses=frozenset({_X})),
    Knob("int8_activations", _BOOL, True, run_time=True, label="int8 activations"),
    # every bf16 step through the fused step, one order of sums per row whatever its company (engine/runner/fused.py)
    Knob("batch_invariant", _BOOL, True, run_time=True, label="batch-invariant bf16",
         help="the same greedy answer whatever the batch: every bf16 row summed in one order", flag="--batch-invariant",
         uses=frozenset({_X, _S})),
    # CUDA graphs for all-decode steps (engine/runner/graphs.py); None: on where the engine runs on CUDA
    Knob("cuda_graphs", _BOOL, None, run_time=True, optional=True, label="CUDA graphs"),
    # fixed when the engine is built
    Knob("dtype", _STR, "auto", choices=("auto", "bfloat16", "float16", "float32"), label="dtype"),
    Knob("attention_backend", _STR, AttentionBackendName.NATIVE, choices=tuple(AttentionBackendName),
         label="attention", uses=frozenset({_X})),
    Knob("kv_cache_dtype", _STR, KvCacheDtype.AUTO, choices=tuple(KvCacheDtype), label="KV cache",
         help="int8 stores the KV cache in 8 bits with a scale per row (twice the tokens in the same memory)",
         value_names=((KvCacheDtype.AUTO, "16-bit"), (KvCacheDtype.INT8, "int8 + row scales")),
         stops=tuple(KvCacheDtype), slider=Box.ENGINE, flag="--kv-cache-dtype", uses=frozenset({_S, _G}),
         needs="rebuild"),
    Knob("kernel_build", _STR, KernelBuild.WAIT, choices=tuple(KernelBuild), label="kernel build"),
    Knob("gpu_memory_utilization", _FLOAT, 0.90, low=0.0, high=1.0, low_exclusive=True, label="GPU memory share"),
    Knob("num_kv_blocks", _INT, None, low=1, optional=True, app_range=(16, 1_000_000), label="KV blocks",
         uses=frozenset({_P, _X})),  # a preset's None: what the app started with; else a rebuild
    Knob("memory_budget_bytes", _INT, None, low=1, optional=True, label="memory budget", unit="B",
         uses=frozenset({_X})),
    Knob("enable_prefix_caching", _BOOL, True, label="prefix cache", uses=frozenset({_X})),
    Knob("pack_weights", _BOOL, False, label="packed weights", uses=frozenset({_X})),
    # changed at run time by set_quantization (a requantization), not by reconfigure
    Knob("quant_format", _STR, DENSE, choices=tuple(f.name for f in QUANT_FORMATS), label="weights",
         help="the weight format: bf16; int8 or fp8 e4m3 (a byte per weight, a scale per row); int4 (a scale and "
         "zero per group of weights); requantized from the 16-bit weights", value_names=_FORMAT_NAMES,
         stops=tuple(f.name for f in QUANT_FORMATS), slider=Box.ENGINE,
         flag="--quant-format", uses=frozenset({_P, _X, _R, _S, _G}), needs="quantization"),
    Knob("quant_group_size", _INT, 32, choices=(32, 64, 128), label="group size",
         help="weights per scale of a grouped format (int4)", flag="--quant-group-size",
         uses=frozenset({_P, _X, _S, _G}), needs="quantization"),
    Knob("max_loras", _INT, 0, low=0, app_range=(0, 64), label="LoRA slots", uses=frozenset({_P, _X}), needs="lora"),
    Knob("max_lora_rank", _INT, 16, low=1, label="LoRA rank", help="the largest adapter rank a slot holds",
         flag="--max-lora-rank", uses=frozenset({_X, _S})),
    Knob("max_cpu_loras", _INT, None, low=0, optional=True, label="LoRAs in host memory",
         help="adapters kept in host memory beyond the slots", flag="--max-cpu-loras", uses=frozenset({_X, _S})),
    # the load generator's (app/load/generator.py LoadConfig); a load knob named as a SamplingParams field is
    # what every generated request samples with
    Knob("arrival_rate", _FLOAT, 2.0, low=0, label="arrival rate", help="Poisson arrivals per second (0: none)",
         unit="req/s", digits=1, stops=tuple(i / 10 for i in range(201)), slider=Box.LOAD, layer=Layer.LOAD,
         uses=frozenset({_P, _C}), needs="load_generator"),
    Knob("temperature", _FLOAT, 0.8, low=0, label="temperature", help="what each generated request samples at",
         digits=2, layer=Layer.LOAD, uses=frozenset({_P})),
    Knob("ignore_eos", _BOOL, False, label="ignore EOS", help="every output runs to its max_tokens (fixed work)",
         layer=Layer.LOAD, uses=frozenset({_P})),
)
KNOB: Mapping[str, Knob] = MappingProxyType({k.name: k for k in KNOBS})
ENGINE_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.layer == Layer.ENGINE)  # EngineConfig's fields
RECONFIGURABLE: tuple[str, ...] = tuple(k.name for k in ENGINE_KNOBS if k.run_time)  # what reconfigure() may change
# knobs whose values are a kind (an enum of engine/events.py): stored as the member, "ngram" as SpecMethod.NGRAM
KIND_KNOBS: tuple[str, ...] = tuple(k.name for k in ENGINE_KNOBS if k.choices and isinstance(k.choices[0], Enum))


def knob(name: str) -> Knob:
    """The row named `name`; KeyError naming the knobs there are."""
    try:
        return KNOB[name]
    except KeyError:
        raise KeyError(f"no knob {name!r}; knobs: {', '.join(KNOB)}") from None


def knob_default(name: str) -> Any:
    return KNOB[name].default


def knobs_for(use: Use, layer: Layer | None = None) -> tuple[Knob, ...]:
    """The rows offered at `use` (of `layer` only, where given), in table order."""
    return tuple(k for k in KNOBS if use in k.uses and (layer is None or k.layer == layer))


def slider_knobs(box: Box) -> tuple[Knob, ...]:
    """The Controls panel's sliders in `box`, top to bottom."""
    return tuple(k for k in KNOBS if k.slider == box)


def knob_items(values: KnobValues) -> Mapping[str, Any]:
    """`values` as a plain mapping, for code that walks knobs by a computed name (a TypedDict takes literal
    keys only)."""
    return cast(Mapping[str, Any], values)


def knob_subset(values: Mapping[str, Any] | KnobValues, names: Iterable[str]) -> KnobValues:
    """The knobs of `values` named in `names` (those it has), as KnobValues."""
    plain = cast(Mapping[str, Any], values)
    return cast(KnobValues, {k: plain[k] for k in names if k in plain})


def check_knobs(values: Mapping[str, Any], *, app: bool = False) -> None:
    """ValueError for the first value in `values` (knob name -> value) its knob does not take; names not in
    the table are not checked here."""
    for name, value in values.items():
        row = KNOB.get(name)
        if row is not None:
            row.check(value, app=app)


class KnobValues(TypedDict, total=False):
    """Knob values by name, typed as the table's rows (tests/test_knob_table.py holds the two together): what
    crosses the GUI (the controls panel's sigConfigChanged, ControlState.config, EngineInfo.config), so a
    misspelt knob or a value of the wrong type is a type checker's error."""

    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    policy: str
    max_step_ms: float | None
    ttft_budget_ms: float | None
    tpot_budget_ms: float | None
    max_queue_len: int | None
    max_predicted_wait_s: float | None
    num_speculative_tokens: int
    spec_method: str | None
    compile: bool
    fused_decode: bool
    int8_activations: bool
    batch_invariant: bool
    cuda_graphs: bool | None
    dtype: str
    attention_backend: str
    kv_cache_dtype: str
    kernel_build: str
    gpu_memory_utilization: float
    num_kv_blocks: int | None
    memory_budget_bytes: int | None
    enable_prefix_caching: bool
    pack_weights: bool
    quant_format: str
    quant_group_size: int
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int | None
    arrival_rate: float
    temperature: float
    ignore_eos: bool
