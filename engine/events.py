"""Torch-free contracts that leave the engine.

Everything here is a frozen dataclass of plain Python values, so the GUI (widgets/), the HTTP server
and the benchmarks can consume engine output without importing torch. This is the only engine module
that widgets/ may import.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum

if sys.version_info >= (3, 11):  # a version check (not try/except) the type checker follows
    from enum import StrEnum
else:  # Python 3.10: the same behaviour, spelled out
    class StrEnum(str, Enum):  # noqa: UP042 (3.10 has no enum.StrEnum)
        """Members are their string values: equal to them, formatted and JSON-encoded as them."""

        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, spec: str) -> str:
            return str.__format__(self, spec)


class StepKind(StrEnum):
    """What a scheduled request runs this step (ScheduledRequest.kind, StepStats.scheduled)."""

    PREFILL = "prefill"  # prompt tokens (a chunk of them under chunked prefill)
    DECODE = "decode"  # the one newest token
    VERIFY = "verify"  # the last known token + draft tokens, checked by the target


class ForwardPath(StrEnum):
    """How the model ran a step (StepStats.forward_path)."""

    NONE = ""  # no forward pass this step
    FUSED = "fused"  # one native call for the whole transformer (EngineConfig.fused_decode)
    LAYERS = "layers"  # layer by layer


class SpecMethod(StrEnum):
    """The speculative proposer (EngineConfig.spec_method; None: no speculation)."""

    NGRAM = "ngram"  # prompt lookup: switched between steps
    DRAFT = "draft"  # a draft model (or a quantized copy of the target): fixed when the engine is built
    MTP = "mtp"  # multi-token prediction heads: fixed when the engine is built


class AttentionBackendName(StrEnum):
    """How attention runs (EngineConfig.attention_backend; chosen once by engine/runner/attention_backend.py)."""

    FAST = "fast"  # batched paged attention: whole-block gathers + matmuls
    COMPILED = "compiled"  # decode attention through torch.compile, the block gather fused in
    NATIVE = "native"  # the C++ kernel streaming each sequence's blocks (engine/kernels); else "fast"
    FLEX = "flex"  # FlexAttention with a paged block mask
    TRITON = "triton"  # the CUDA path's Triton kernels (engine/kernels/gpu)
    REFERENCE = "reference"  # one sequence at a time, the readable path the others are held to


class KvCacheDtype(StrEnum):
    """The KV cache's element type (EngineConfig.kv_cache_dtype)."""

    AUTO = "auto"  # the model's dtype
    INT8 = "int8"  # 8-bit rows with a float32 scale per (token, KV head)


class KernelBuild(StrEnum):
    """When the native kernels' first build on a machine runs (EngineConfig.kernel_build)."""

    WAIT = "wait"  # before the first step
    BACKGROUND = "background"  # torch's kernels until the build is done, then the native ones


class SchedulingPolicy(StrEnum):
    """Which waiting request is admitted first (SchedulerConfig.policy; engine/core/policies.py)."""

    FCFS = "fcfs"  # first come, first served
    SPF = "spf"  # shortest prompt first
    PRIORITY = "priority"  # lowest Request.priority first


class LoraEventKind(StrEnum):
    """A change in where a LoRA adapter lives (LoraPoolEvent.kind)."""

    ADDED = "added"
    REMOVED = "removed"
    LOAD = "load"  # into a device slot
    EVICT = "evict"  # out of its slot
    DROP = "drop"  # host -> disk


class TokenSource(str, Enum):
    """How a token came to be: the colours of the token stream."""

    PROMPT = "prompt"
    DECODED = "decoded"  # one plain decode step produced it
    ACCEPTED = "accepted"  # a speculative draft token the target agreed with
    CORRECTED = "corrected"  # the target's own token at the first disagreement
    BONUS = "bonus"  # the extra token after a fully accepted draft


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    # top alternatives as (token_id, logprob, text), best first
    top: tuple[tuple[int, float, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """What one step produced for one request (a delta, not the whole text)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_text: str
    # every generated token so far: from the engine a TokenIds (engine/token_ids.py), read-only and tuple-like,
    # that shares the request's list instead of copying it every step (json: write list(token_ids))
    token_ids: Sequence[int]
    text: str  # every generated (released) character so far
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | "rejected"
    sources: tuple[TokenSource, ...] = ()  # one per new token
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per new token when asked for
    num_prompt_tokens: int = 0
    error: str | None = None
    held_back_chars: int = 0  # characters decoded but not yet released (partial UTF-8 / stop string)
    # The text of each new token, filled only when a step emits several (speculative decoding), so a
    # viewer can show their boundaries without a tokenizer of its own.
    new_token_pieces: tuple[str, ...] = ()
    ttft_s: float | None = None  # arrival to first token (perf_counter), once there is one
    # decode rate so far: (output tokens - 1) / (last token time - first token time); None below 2 tokens
    tokens_per_s: float | None = None
    lora_name: str | None = None  # the LoRA adapter the request runs with; None = the base model


def _slot_writer(cls: type[RequestOutput]) -> Callable[..., RequestOutput]:
    """A constructor of the frozen, slotted dataclass `cls` (RequestOutput) with the same arguments, every field
    given (by position in field order, the fastest, or by name): it writes each slot through its descriptor. The
    same instance as cls(...), in about half the time: the dataclass's frozen __init__ reaches object.__setattr__
    by a global and an attribute lookup for each field. make_output (once a request a step) passes them by
    position: 1.55 us a call against 3.16 through the dataclass by name (2-core Zen 4). Generated as dataclasses
    generates __init__."""
    names = [f.name for f in fields(cls)]
    lines = [f"def make({', '.join(names)}):", "    o = _new(_cls)"]
    lines += [f"    _set_{n}(o, {n})" for n in names] + ["    return o"]
    scope = {"_new": object.__new__, "_cls": cls, **{f"_set_{n}": getattr(cls, n).__set__ for n in names}}
    exec("\n".join(lines), scope)  # noqa: S102 (source made here from the dataclass's own field names)
    make: Callable[..., RequestOutput] = scope["make"]
    return make


# RequestOutput(...) with every field given, for the engine's step (engine/core/output_processor.py)
new_request_output = _slot_writer(RequestOutput)


@dataclass(frozen=True, slots=True)
class StepStats:
    """Published after every engine step."""

    step: int
    t_start: float  # time.perf_counter() at the start of the step
    wall_time_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_preempted: int  # preemptions that happened in this step
    kv_blocks_used: int
    kv_blocks_total: int
    num_verify_tokens: int = 0
    num_rejected: int = 0  # requests refused by admission control in this step
    num_finished: int = 0
    num_failed: int = 0  # of those, requests that failed on their own (finish_reason "error")
    # per request scheduled this step: (request_id, num_tokens, kind)
    scheduled: tuple[tuple[str, int, StepKind], ...] = ()
    # counted from the shapes this step ran (engine/perf/step_cost.py), not timed
    flops: int = 0
    bytes_moved: int = 0
    scheduled_loras: tuple[str | None, ...] = ()  # the adapter of each entry of `scheduled` (None = base)
    forward_path: ForwardPath = ForwardPath.NONE  # how the model ran (fused, layer by layer, or not at all)

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_verify_tokens


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    weights_bytes: int
    kv_block_bytes: int  # bytes of one KV block across all layers (K and V)
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_cached: int  # free but holding a reusable prefix
    activation_bytes: int
    other_bytes: int
    free_bytes: int
    device_total_bytes: int
    source: str  # "nvml" | "torch.cuda" | "budget"
    device: str = "cpu"
    packed_weights_bytes: int = 0  # part of weights_bytes: the oneDNN-packed copies (EngineConfig.pack_weights)
    lora_device_bytes: int = 0  # the LoRA pool's device slots (preallocated; not part of weights_bytes)
    lora_host_bytes: int = 0  # LoRA adapters kept in host memory (those in a slot and the host LRU)
    # the captured CUDA graphs' memory pool, measured (torch's reserved bytes across each capture); 0 on the
    # CPU, where the static buffers run uncaptured; None with EngineConfig.cuda_graphs off
    graphs_bytes: int | None = None
    # the most a step's activations take (logits and sampling included), measured by the start-up profile
    # step on a GPU (the KV cache was sized to leave it free); None where not measured (the CPU: there
    # activation_bytes is the last step's, computed from its shapes)
    activation_peak_bytes: int | None = None

    @property
    def kv_bytes_total(self) -> int:
        return self.kv_block_bytes * self.kv_blocks_total


@dataclass(frozen=True, slots=True)
class BlockInfo:
    block_id: int
    ref_count: int
    cached: bool  # holds a full block registered in the prefix cache
    owners: tuple[str, ...] = ()  # request ids whose block table contains it


@dataclass(frozen=True, slots=True)
class BlockMapSnapshot:
    block_size: int
    num_blocks: int
    block_tables: dict[str, tuple[int, ...]] = field(default_factory=dict)  # request_id -> blocks
    blocks: tuple[BlockInfo, ...] = ()  # only blocks in use or cached; the rest are free


@dataclass(frozen=True, slots=True)
class RequestTimeline:
    """Per-request timings (perf_counter seconds), filled in as the request advances."""

    request_id: str
    arrival: float
    num_prompt_tokens: int
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    num_output_tokens: int = 0
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    lora_name: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.finished is None or self.first_token is None or self.num_output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.num_output_tokens - 1)


@dataclass(frozen=True, slots=True)
class SpecDecodeStats:
    """Speculative decoding counters for one step (all zero when speculation is off)."""

    step: int
    method: SpecMethod | None
    num_draft_tokens: int
    num_accepted_tokens: int
    num_emitted_tokens: int  # accepted + corrected/bonus
    num_verify_passes: int  # requests verified in this step
    accepted_per_position: tuple[int, ...] = ()  # index i: drafts accepted at position i
    drafted_per_position: tuple[int, ...] = ()
    predicted_speedup: float | None = None  # from the acceptance rate and a cost model; labelled predicted
    draft_length: int | None = None  # drafts per request chosen for this step (engine/spec/draft_length.py)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


@dataclass(frozen=True, slots=True)
class TradeoffPoint:
    """One measured configuration on the speed / cost / quality plot."""

    label: str  # e.g. "bits=4 batch=32 k=0"
    config: dict[str, object]
    tokens_per_s_per_user: float  # measured
    total_tokens_per_s: float  # measured
    perplexity_delta_pct: float | None  # measured vs 16 bits; None until measured
    cost_per_million_tokens: float | None = None  # from total tokens/s and the price per GPU-hour


@dataclass(frozen=True, slots=True)
class LoraPoolEvent:
    """A change in where a LoRA adapter lives (engine/lora/pool.py)."""

    kind: LoraEventKind
    name: str
    slot: int | None = None  # the device slot loaded or evicted
    source: str | None = None  # "load": "host" or "disk"
    seconds: float = 0.0  # "load": measured time of the copy (and the read from disk)


@dataclass(frozen=True, slots=True)
class LoraAdapterInfo:
    name: str
    lora_id: int  # unique per add_lora: a re-added name gets a new id (and never shares its KV blocks)
    path: str
    rank: int
    alpha: float
    targets: tuple[str, ...]  # PEFT names: q_proj, k_proj, ...
    nbytes: int
    residence: str  # "device" | "host" | "disk"
    slot: int | None = None


@dataclass(frozen=True, slots=True)
class LoraPoolSnapshot:
    device_slots: tuple[str | None, ...]  # the adapter in each device slot
    host: tuple[str, ...]  # adapters in host memory only, least recently used first
    num_hits: int  # cumulative: adapters a step needed that were already in a slot
    num_loads: int
    num_evictions: int
    device_bytes: int
    host_bytes: int


@dataclass(frozen=True, slots=True)
class EngineStepEvent:
    """Everything one step published, in one immutable bundle (what the GUI host forwards)."""

    stats: StepStats
    outputs: tuple[RequestOutput, ...] = ()
    finished: tuple[RequestTimeline, ...] = ()  # requests that ended in this step
    spec: SpecDecodeStats | None = None
    arrived: tuple[tuple[str, float, int], ...] = ()  # (request_id, arrival time, prompt tokens) admitted to the queue
    lora_events: tuple[LoraPoolEvent, ...] = ()  # adapter loads / evictions / adds / removals in this step
    lora_pool: LoraPoolSnapshot | None = None  # None when the engine has no LoRA pool (max_loras=0)
