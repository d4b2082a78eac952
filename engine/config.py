"""EngineConfig: every knob of the engine as explicit data; SchedulerConfig: the scheduler's part of it,
held (not copied) by EngineConfig. Defaults and checks of the knobs the app turns: engine/knobs.py."""
from __future__ import annotations

from dataclasses import InitVar, dataclass, field, replace
from typing import Any

from engine.events import AttentionBackendName, KernelBuild, KvCacheDtype, SchedulingPolicy, SpecMethod
from engine.knobs import ENGINE_KNOBS, KIND_KNOBS, KNOB, check_knobs, knob_default

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduler's own knobs, replaced whole on reconfigure (frozen: the scheduler's copy never
    changes in the middle of a schedule() call)."""

    max_num_seqs: int = knob_default("max_num_seqs")
    max_num_batched_tokens: int = knob_default("max_num_batched_tokens")  # the token budget of one step
    enable_chunked_prefill: bool = knob_default("enable_chunked_prefill")
    policy: SchedulingPolicy = knob_default("policy")
    # distinct LoRA adapters the running batch may hold: the adapter pool's device slots
    # (0: no LoRA support, no wrappers in the model)
    max_loras: int = knob_default("max_loras")
    # While requests are decoding, a step's length is their time per output token: prompt chunks beside
    # them are cut so a step is predicted (from the steps run so far) to take at most this long. None:
    # the token budget alone (engine/core/step_time.py).
    max_step_ms: float | None = knob_default("max_step_ms")
    # Serving toward a latency budget (None: off). With ttft_budget_ms, prompt work goes to the prompts that
    # can still meet it, shortest first; the ones that cannot wait behind them, the oldest still advancing a
    # chunk each step. With tpot_budget_ms, prompt chunks are cut so that every decoding request's time per
    # output token stays within it (engine/core/scheduler.py).
    ttft_budget_ms: float | None = knob_default("ttft_budget_ms")
    tpot_budget_ms: float | None = knob_default("tpot_budget_ms")

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", KNOB["policy"].check(self.policy))  # "spf" -> SchedulingPolicy.SPF

    @classmethod
    def of(cls, config: EngineConfig) -> SchedulerConfig:
        """The scheduling knobs of an EngineConfig (the one it holds)."""
        return config.scheduler


SCHEDULER_FIELDS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "policy", "max_loras",
                    "max_step_ms", "ttft_budget_ms", "tpot_budget_ms")


@dataclass(slots=True)
class EngineConfig:
    """`EngineConfig(max_num_seqs=8)` and `config.max_num_seqs` read and write through `scheduler`; so does
    `dataclasses.replace(config, max_num_seqs=8)` (a replace that passes `scheduler=` alone keeps the old
    scheduling values: pass the fields instead)."""

    model: str = DEFAULT_MODEL  # a built-in name, a Hugging Face folder, a .gguf file or a Hub id
    # "auto": bf16 weights on the CPU, computed in bf16 where the CPU has native bf16 dot products, else
    # prefill's products in fp32 (engine/runner/cpu_compute.py); bf16 on GPUs of compute capability 8.0+,
    # fp16 on older GPUs
    dtype: str = knob_default("dtype")  # "auto", "bfloat16", "float16", "float32"
    # "auto": $INFERLAB_DEVICE when set (the test suite pins "cpu"), else CUDA when torch sees a GPU, else CPU
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:1", ...
    seed: int = 0
    num_threads: int | None = None  # torch CPU threads; None: the CPU's free cores (engine/runner/threads.py)

    # KV cache
    block_size: int = 16
    # "auto": K/V in the model's dtype; "int8": 8-bit rows with a float32 scale per (token, KV head)
    # (engine/models/layers/kv_quant.py): 1.88x the blocks in the same memory at head_dim 64, decoded
    # through the eager attention path. Fixed for the engine's life (the cache is allocated with it).
    kv_cache_dtype: KvCacheDtype = knob_default("kv_cache_dtype")
    # Explicit budgets are honoured on every device (CPU and GPU alike). A KV budget: with a draft model,
    # the target's and the draft's KV blocks share it. None: 512 MiB on the CPU; on a GPU the KV cache
    # gets what a profiled warm-up step leaves (total x gpu_memory_utilization - in use - peak of a step).
    kv_cache_memory_bytes: int | None = None
    # When set: one budget for weights + KV (the draft model's included); the KV cache gets what the
    # weights leave, so fewer weight bytes (quantization) buy more KV blocks. Overrides kv_cache_memory_bytes.
    memory_budget_bytes: int | None = knob_default("memory_budget_bytes")
    # share of the GPU's memory the engine may use (no explicit budget)
    gpu_memory_utilization: float = knob_default("gpu_memory_utilization")
    num_kv_blocks: int | None = knob_default("num_kv_blocks")  # overrides the budget (tests)
    enable_prefix_caching: bool = knob_default("enable_prefix_caching")
    max_model_len: int | None = None  # defaults to the model's context length

    # Scheduling: max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, policy (and max_loras) live
    # in `scheduler`; the InitVars at the end let them be passed here as before
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    # Model execution
    # "native" (default): decode attention by a C++ kernel that streams each sequence's K/V blocks from
    # the paged cache once, in float32 registers (engine/kernels; bf16 on the CPU, head_dim 64/128;
    # built once per machine and ISA tier, ~25-60 s: engine/kernels); everything
    # it does not cover (prefill, other dtypes and devices) runs the "fast" path. "fast": batched paged
    # attention (whole-block gathers + matmuls). "compiled": decode attention through torch.compile with
    # the block gather fused into its reductions. "flex": decodes and cached-context prefill chunks
    # through FlexAttention with a paged block mask, K/V read in place (compiled on CUDA, eager on the CPU;
    # only when asked for: on the first GPU run its compile had not finished minutes into the first step).
    # "reference": the readable one-sequence-at-a-time path the tests hold the others to. What runs is
    # chosen once, by engine/runner/attention_backend.py.
    attention_backend: AttentionBackendName = knob_default("attention_backend")
    # torch.compile each decode step's forward pass as one call (the attention an opaque op in it; steps with
    # prompt rows run eager; the same numbers as eager, engine/models/llama.py), run single 16-bit rows on
    # the CPU (decode of one stream, where the native kernel is not built) through a compiled matrix-vector
    # reduction at ~2x the library's memory bandwidth (engine/models/layers/gemv.py), decode attention
    # gather-fused where the native kernel does not apply; the first steps after switching on pay for
    # compiling. Switchable at run time.
    compile: bool = knob_default("compile")
    # bf16 on the CPU: a few rows (decode) of every Linear, and every int4 layer, through the native
    # weight-streaming kernel (engine/kernels/stream_linear.cpp), which reads the layer's one copy
    # of its weights once per call; off: the library's kernels (oneDNN; torch's compiled gemv under compile).
    stream_linear: bool = True
    # bf16 on the CPU: keep each Linear's weight also in oneDNN's packed layout (engine/models/layers/linear.py;
    # ~15 % faster prefill GEMMs at 47 rows) at the price of a second copy of those weights.
    pack_weights: bool = knob_default("pack_weights")
    # CUDA: replay all-decode steps from CUDA graphs captured at engine build, one per padded batch-size
    # bucket up to max_num_seqs, over static buffers (engine/runner/graphs.py). None (the default): on where
    # the engine runs on CUDA, off elsewhere; False: off (--no-cuda-graphs). On the CPU, True runs the same
    # static buffers without capture (what the tests check).
    cuda_graphs: bool | None = knob_default("cuda_graphs")
    # bf16 on the CPU, 16-bit KV cache, compile off: a step of decodes and chain verifies (up to two calls of
    # 8 rows) without LoRA adapters runs the whole transformer (norms, q/k/v, RoPE, KV writes, paged
    # attention, MLP, lm_head) in one native call a batch (engine/runner/fused.py) instead of ~360 small
    # torch ops; StepStats.forward_path says
    # which path each step ran. Everything else runs layer by layer. Switchable at run time.
    fused_decode: bool = knob_default("fused_decode")
    # In the fused decode step, 4- and 8-bit layers (and an int8 lm_head) quantize their activation row to
    # int8 (one scale per 32 columns, as llama.cpp's Q8 activations) and multiply with integer dot products
    # (AVX-512 VNNI where present): fewer instructions per weight. Off: the exact bf16-activation bodies.
    # Its quality cost: `python scripts/q8_quality.py` (figures in docs/measurements/kernels.md). Switchable at run
    # time.
    int8_activations: bool = knob_default("int8_activations")
    # on the CPU in bf16: each row's numbers, and so a greedy answer, the same whatever the batch, the chunking
    # or a preemption: every step the fused step can run goes through it (engine/runner/fused.py accepts)
    batch_invariant: bool = knob_default("batch_invariant")
    # The native kernels' first build on a machine (engine/kernels, ~25-60 s, once per ISA tier): "wait"
    # builds them before the first step (library calls, benches, tests); "background" runs torch's kernels
    # until the build is done, then switches to the native ones between two steps (the app: live tokens
    # within seconds of a first start).
    kernel_build: KernelBuild = knob_default("kernel_build")

    # Later features (quantization, speculation, LoRA) read these
    quant_format: str = knob_default("quant_format")  # a name from engine/quant_formats.py
    # 32 keeps int4 closest to 16 bits; 64 and 128 store fewer scales
    quant_group_size: int = knob_default("quant_group_size")
    quant_embeddings: bool = False  # also the embedding table and lm_head (int8 per row; see quant_embed)
    quant_outlier_channels: int = 0  # input channels per layer kept in 16 bits (LLM.int8 style)
    quant_reference: bool = False  # dequantize-then-matmul instead of the fast kernels
    spec_method: SpecMethod | None = knob_default("spec_method")
    num_speculative_tokens: int = knob_default("num_speculative_tokens")
    draft_model: str | None = None  # a name, folder or .gguf sharing the target's tokenizer
    draft_quant_format: str | None = None  # the draft's weight format; with no draft_model, a quantized target copy
    # pick the draft length each step (at most num_speculative_tokens) for the most tokens per second, from
    # measured step times and acceptance (engine/spec/draft_length.py); False: always num_speculative_tokens
    adaptive_draft_length: bool = True
    mtp_heads: str | None = None  # spec_method "mtp": a heads .safetensors (default: where train-mtp saves)
    mtp_tree_widths: tuple[int, ...] = (3, 2, 1, 1, 1, 1, 1, 1)  # candidates per tree level
    mtp_max_tree_tokens: int = 8  # tree rows per step, shared by the requests (at least a chain each);
    # small on the CPU, where each extra row costs compute; a GPU verifies 64 rows as fast as one
    # Multi-LoRA (engine/lora): adapters in device slots (scheduler.max_loras), the largest rank a slot
    # holds, and adapters kept in host memory beyond the slots (None: max_loras)
    max_lora_rank: int = knob_default("max_lora_rank")
    max_cpu_loras: int | None = knob_default("max_cpu_loras")

    # Admission control (engine/core/admission.py): beyond these add_request raises RequestRejected; None = off
    max_queue_len: int | None = knob_default("max_queue_len")  # waiting requests (queued + preempted)
    # predicted queue wait, from measured step rates
    max_predicted_wait_s: float | None = knob_default("max_predicted_wait_s")

    # the scheduler's fields as constructor arguments (None: the value `scheduler` holds)
    max_num_seqs: InitVar[int | None] = None
    max_num_batched_tokens: InitVar[int | None] = None
    enable_chunked_prefill: InitVar[bool | None] = None
    policy: InitVar[SchedulingPolicy | str | None] = None
    max_loras: InitVar[int | None] = None
    max_step_ms: InitVar[float | None] = None
    ttft_budget_ms: InitVar[float | None] = None
    tpot_budget_ms: InitVar[float | None] = None

    def __post_init__(self, *scheduling: Any) -> None:
        given = {k: v for k, v in zip(SCHEDULER_FIELDS, scheduling, strict=True) if v is not None}
        if given:
            self.scheduler = replace(self.scheduler, **given)
        # every knob of the table, against its range or list (engine/knobs.py)
        check_knobs({k.name: getattr(self, k.name) for k in ENGINE_KNOBS})
        for name in KIND_KNOBS:  # a kind given as its string is stored as its enum member ("none": None)
            if name not in SCHEDULER_FIELDS:  # SchedulerConfig stores its own
                setattr(self, name, KNOB[name].check(getattr(self, name)))
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")

    def knob_values(self) -> dict[str, Any]:
        """Every setting by field name, the scheduler's flattened in (what EngineInfo shows, what
        comparisons key engines by)."""
        return {**{k: getattr(self, k) for k in self.__slots__ if k != "scheduler"},
                **{k: getattr(self.scheduler, k) for k in SCHEDULER_FIELDS}}


def _scheduler_field(name: str) -> property:
    def get(self: EngineConfig) -> Any:
        return self.scheduler.__getattribute__(name)

    def set_(self: EngineConfig, value: Any) -> None:
        KNOB[name].check(value)
        self.scheduler = replace(self.scheduler, **{name: value})

    return property(get, set_, doc=f"scheduler.{name}")


for _name in SCHEDULER_FIELDS:  # read and written through the held SchedulerConfig
    setattr(EngineConfig, _name, _scheduler_field(_name))
