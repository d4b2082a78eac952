"""The warm-up step that sizes a GPU's KV cache (vLLM / nano-vllm style): run the model once at the
worst-case shape of a step, over a throwaway KV cache just large enough, and measure the peak memory
it allocated on top of what was in use. The KV cache then gets total x utilisation - in use - that
peak (engine/runner/setup.py: gpu_kv_budget), so a step never runs out of memory mid-batch.

Worst case of one step: the token budget (max_num_batched_tokens) as one prefill (attention's
scores grow with the square of a sequence's length, so one long sequence peaks above many short
ones), then logits and sampling (top-k / top-p sort included) for max_num_seqs rows.

With CUDA graphs on, the start-up graphs are then captured once on a throwaway runner and their bytes
measured (profile_graph_bytes), before the KV cache is sized (vLLM's order: profile, graphs, KV); what
they hold does not grow with the cache, so the throwaway's small cache measures the real one's graphs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest
from engine.events import AttentionBackendName, KernelBuild, StepKind
from engine.models.layers.sampler import sample
from engine.models.llama import LlamaForCausalLM
from engine.models.model_config import ModelConfig
from engine.sampling_params import SamplingParams


class PeakMeter(Protocol):
    def reset(self) -> None: ...
    def allocated(self) -> int: ...
    def peak(self) -> int: ...


@dataclass(slots=True)
class CudaPeakMeter:
    """torch's caching allocator on one GPU: this process's bytes, not other processes'."""

    device: torch.device

    def reset(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)


@dataclass(slots=True)
class WarmupShape:
    num_prefill_tokens: int  # one sequence of this many tokens
    num_sample_rows: int  # rows that get logits and are sampled


def worst_case_shape(config: EngineConfig, model_config: ModelConfig) -> WarmupShape:
    tokens = min(config.max_num_batched_tokens, config.max_model_len or model_config.max_position_embeddings,
                 model_config.max_position_embeddings)
    return WarmupShape(max(1, tokens), max(1, config.max_num_seqs))


@torch.inference_mode()
def warmup_step(model: LlamaForCausalLM, model_config: ModelConfig, shape: WarmupShape, block_size: int,
                device: torch.device, dtype: torch.dtype,
                attention_backend: AttentionBackendName = AttentionBackendName.FAST) -> torch.Tensor:
    """Run one worst-case step (a prefill of shape.num_prefill_tokens tokens, then logits and sampling
    for shape.num_sample_rows rows) over a throwaway cache, on the attention path the engine will run
    (`attention_backend`: on CUDA "native" is the Triton kernels, whose prefill keeps no score matrix);
    returns the sampled token ids."""
    from engine.runner.model_runner import ModelRunner  # the runner imports nothing from here

    n = shape.num_prefill_tokens
    blocks = -(-n // block_size)
    runner = ModelRunner(model, model_config, blocks, block_size, device, dtype)
    if attention_backend != AttentionBackendName.FAST:
        runner.set_execution(attention_backend, compile=False)
    bm = BlockManager(blocks, block_size, enable_prefix_caching=False)
    ids = [i % model_config.vocab_size for i in range(n)]
    req = Request("__warmup", ids, SamplingParams(max_tokens=1))
    bm.allocate(req.request_id, ids, n)
    hidden = runner.forward([ScheduledRequest(req, n, StepKind.PREFILL)], bm)
    rows = torch.arange(shape.num_sample_rows, device=device) % n
    logits = model.compute_logits(hidden[rows])
    # sampled with top-k and top-p: the sort over the vocabulary is the sampler's largest allocation
    params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.9, max_tokens=1)] * shape.num_sample_rows
    result = sample(logits, params, [None] * shape.num_sample_rows)
    del runner, hidden, logits
    return torch.tensor([t if t is not None else -1 for t in result.token_ids])


def profile_peak_bytes(model: LlamaForCausalLM, model_config: ModelConfig, config: EngineConfig,
                       device: torch.device, dtype: torch.dtype, meter: PeakMeter | None = None) -> int:
    """Bytes a worst-case step allocates above what was allocated before it (the throwaway cache
    included, a small over-estimate on the safe side)."""
    meter = meter or CudaPeakMeter(device)
    meter.reset()
    before = meter.allocated()
    warmup_step(model, model_config, worst_case_shape(config, model_config), config.block_size, device, dtype,
                config.attention_backend)
    return max(0, meter.peak() - before)


@torch.inference_mode()
def profile_graph_bytes(model: LlamaForCausalLM, model_config: ModelConfig, config: EngineConfig,
                        device: torch.device, dtype: torch.dtype) -> int:
    """Bytes the start-up decode graphs take (EngineConfig.cuda_graphs; engine/runner/graphs.py), measured
    before the KV cache is sized: the same buckets captured once on a throwaway runner whose cache holds
    one max_model_len context (all rows point at the same blocks), torch's reserved bytes before and
    after. The figure holds for the real cache: a graph's static buffers and FlexAttention's block mask
    are sized by the batch and context buckets, none by the cache's page count. 0 on the CPU (the static
    buffers are built, nothing is captured) and where graphs never run (the native kernel, compiled
    decode, the reference backend)."""
    from engine.runner.graphs import DecodeGraphs, startup_context_bucket
    from engine.runner.model_runner import ModelRunner  # the runner imports nothing from here

    capture = device.type == "cuda"
    max_len = min(config.max_model_len or model_config.max_position_embeddings,
                  model_config.max_position_embeddings)
    runner = ModelRunner(model, model_config, 1, config.block_size, device, dtype,
                         kv_cache_dtype=config.kv_cache_dtype)
    runner.set_execution(config.attention_backend, bool(config.compile),
                         wait_kernels=config.kernel_build == KernelBuild.WAIT)
    if capture:  # one context of the widest start-up bucket: what a capture's warm-up may touch
        runner.resize_kv(startup_context_bucket(runner.backend, max_len, config.block_size))
    graphs = runner.graphs = DecodeGraphs(capture=capture)
    taken = graphs.build_all(runner, config.max_num_seqs, max_len)
    del runner, graphs
    return taken
