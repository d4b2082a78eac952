"""EngineConfig: every knob of the engine as explicit data."""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL = "smollm2-135m"


@dataclass(slots=True)
class EngineConfig:
    model: str = DEFAULT_MODEL  # a built-in name, a Hugging Face folder, a .gguf file or a Hub id
    # "auto": bf16 weights on the CPU, computed in bf16 where the CPU has native bf16 dot products, else
    # prefill's products in fp32 (engine/runner/cpu_compute.py); bf16 on GPUs of compute capability 8.0+,
    # fp16 on older GPUs
    dtype: str = "auto"  # "auto", "bfloat16", "float16", "float32"
    # "auto": $INFERLAB_DEVICE when set (the test suite pins "cpu"), else CUDA when torch sees a GPU, else CPU
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:1", ...
    seed: int = 0
    num_threads: int | None = None  # torch CPU threads; None: the CPU's free cores (engine/runner/threads.py)

    # KV cache
    block_size: int = 16
    # "auto": K/V in the model's dtype; "int8": 8-bit rows with a float32 scale per (token, KV head)
    # (engine/models/layers/kv_quant.py): 1.88x the blocks in the same memory at head_dim 64, decoded
    # through the eager attention path. Fixed for the engine's life (the cache is allocated with it).
    kv_cache_dtype: str = "auto"
    # Explicit budgets are honoured on every device (CPU and GPU alike). A KV budget: with a draft model,
    # the target's and the draft's KV blocks share it. None: 512 MiB on the CPU; on a GPU the KV cache
    # gets what a profiled warm-up step leaves (total x gpu_memory_utilization - in use - peak of a step).
    kv_cache_memory_bytes: int | None = None
    # When set: one budget for weights + KV (the draft model's included); the KV cache gets what the
    # weights leave, so fewer weight bytes (quantization) buy more KV blocks. Overrides kv_cache_memory_bytes.
    memory_budget_bytes: int | None = None
    gpu_memory_utilization: float = 0.90  # share of the GPU's memory the engine may use (no explicit budget)
    num_kv_blocks: int | None = None  # overrides the budget (tests)
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # defaults to the model's context length

    # Scheduling
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512  # the token budget of one step
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"

    # Model execution
    # "native" (default): decode attention by a C++ kernel that streams each sequence's K/V blocks from
    # the paged cache once, in float32 registers (engine/kernels; bf16 on the CPU, head_dim 64/128;
    # built once per machine, ~25 s; AVX-512 bf16 dot products where the CPU has them); everything
    # it does not cover (prefill, other dtypes and devices) runs the "fast" path. "fast": batched paged
    # attention (whole-block gathers + matmuls). "compiled": decode attention through torch.compile with
    # the block gather fused into its reductions. "flex": decodes and cached-context prefill chunks
    # through FlexAttention with a paged block mask, K/V read in place (compiled on CUDA, where "native"
    # means this; eager on the CPU; not yet run on a GPU). "reference": the readable one-sequence-at-a-time
    # path the tests hold the others to. What runs is chosen once, by engine/runner/attention_backend.py.
    attention_backend: str = "native"
    # torch.compile the dense code between two attentions (one call per layer), run single 16-bit rows on
    # the CPU (decode of one stream) through a compiled matrix-vector reduction at ~2x the library's
    # memory bandwidth (engine/models/layers/gemv.py), decode attention gather-fused where the native kernel
    # does not apply; the first steps after switching on pay for compiling. Switchable at run time.
    compile: bool = False
    # bf16 on the CPU: a few rows (decode) of every Linear, and every int4 layer, through the native
    # weight-streaming kernel (engine/kernels/stream_linear.cpp), which reads the layer's one copy
    # of its weights once per call; off: the library's kernels (oneDNN; torch's compiled gemv under compile).
    stream_linear: bool = True
    # bf16 on the CPU: keep each Linear's weight also in oneDNN's packed layout (engine/models/layers/linear.py;
    # ~15 % faster prefill GEMMs at 47 rows) at the price of a second copy of those weights.
    pack_weights: bool = False
    # CUDA: replay all-decode steps from CUDA graphs captured per padded batch-size and context bucket
    # over static buffers (engine/runner/graphs.py; not yet run on a GPU). On the CPU the same static
    # buffers run without capture (what the tests check). Off by default.
    cuda_graphs: bool = False
    # bf16 on the CPU, 16-bit KV cache, compile off: a step of decodes and chain verifies (up to two calls of
    # 8 rows) without LoRA adapters runs the whole transformer (norms, q/k/v, RoPE, KV writes, paged
    # attention, MLP, lm_head) in one native call a batch (engine/runner/fused.py) instead of ~360 small
    # torch ops; StepStats.forward_path says
    # which path each step ran. Everything else runs layer by layer. Switchable at run time.
    fused_decode: bool = True
    # In the fused decode step, 4- and 8-bit layers (and an int8 lm_head) quantize their activation row to
    # int8 (one scale per 32 columns, as llama.cpp's Q8 activations) and multiply with integer dot products
    # (AVX-512 VNNI where present): fewer instructions per weight. Off: the exact bf16-activation bodies.
    # Its quality cost: `python scripts/q8_quality.py` (figures in the README). Switchable at run time.
    int8_activations: bool = True
    # The native kernels' first build on a machine (engine/kernels, ~25-60 s, once per ISA tier): "wait"
    # builds them before the first step (library calls, benches, tests); "background" runs torch's kernels
    # until the build is done, then switches to the native ones between two steps (the app: live tokens
    # within seconds of a first start).
    kernel_build: str = "wait"

    # Later features (quantization, speculation, LoRA) read these
    quant_bits: int = 16
    quant_group_size: int = 32  # 32 keeps int4 closest to 16 bits; 64 and 128 store fewer scales
    quant_embeddings: bool = False  # also the embedding table and lm_head (int8 per row; see quant_embed)
    quant_outlier_channels: int = 0  # input channels per layer kept in 16 bits (LLM.int8 style)
    quant_reference: bool = False  # dequantize-then-matmul instead of the fast kernels
    spec_method: str | None = None
    num_speculative_tokens: int = 0
    draft_model: str | None = None  # a name, folder or .gguf sharing the target's tokenizer
    draft_quant_bits: int | None = None  # quantize the draft; with no draft_model, a quantized target copy
    mtp_heads: str | None = None  # spec_method "mtp": a heads .safetensors (default: where train-mtp saves)
    mtp_tree_widths: tuple[int, ...] = (3, 2, 1, 1, 1, 1, 1, 1)  # candidates per tree level
    mtp_max_tree_tokens: int = 8  # tree rows per step, shared by the requests (at least a chain each);
    # small on the CPU, where each extra row costs compute; a GPU verifies 64 rows as fast as one
    # Multi-LoRA (engine/lora): adapters in device slots (0: no LoRA support, no wrappers in the model),
    # the largest rank a slot holds, and adapters kept in host memory beyond the slots (None: max_loras)
    max_loras: int = 0
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    # Admission control (engine/core/admission.py): beyond these add_request raises RequestRejected; None = off
    max_queue_len: int | None = None  # waiting requests (queued + preempted)
    max_predicted_wait_s: float | None = None  # predicted queue wait, from measured step rates

    def __post_init__(self) -> None:
        if self.max_queue_len is not None and self.max_queue_len < 0:
            raise ValueError(f"max_queue_len must be >= 0 or None, got {self.max_queue_len}")
        if self.max_predicted_wait_s is not None and not self.max_predicted_wait_s >= 0:
            raise ValueError(f"max_predicted_wait_s must be >= 0 or None, got {self.max_predicted_wait_s}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be auto, bfloat16, float16 or float32, got {self.dtype!r}")
        if self.attention_backend not in ("fast", "compiled", "native", "flex", "reference"):
            raise ValueError(f"attention_backend must be 'fast', 'compiled', 'native', 'flex' or 'reference', "
                             f"got {self.attention_backend!r}")
        if self.quant_group_size not in (32, 64, 128):
            raise ValueError(f"quant_group_size must be 32, 64 or 128, got {self.quant_group_size}")
        if self.max_loras < 0 or self.max_lora_rank < 1 or (self.max_cpu_loras or 0) < 0:
            raise ValueError(f"max_loras and max_cpu_loras must be >= 0 and max_lora_rank >= 1, got "
                             f"{self.max_loras}, {self.max_cpu_loras}, {self.max_lora_rank}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_dtype not in ("auto", "int8"):
            raise ValueError(f"kv_cache_dtype must be 'auto' or 'int8', got {self.kv_cache_dtype!r}")
        if self.kernel_build not in ("wait", "background"):
            raise ValueError(f"kernel_build must be 'wait' or 'background', got {self.kernel_build!r}")
        if self.quant_bits not in (16, 8, 4):
            raise ValueError(f"quant_bits must be 16, 8 or 4, got {self.quant_bits}")
