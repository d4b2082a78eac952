"""A draft model that proposes tokens for speculative decoding, with its own paged KV cache.

It shadows every target request it drafts for: its cache holds the request's tokens up to
``computed[request_id]``; each round catches up on the tokens the target accepted since, then drafts
k tokens greedily (one batched pass per token). After verification the target tells it how many of
its positions are still valid (rollback); the rest is simply overwritten next time.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.block_manager import BlockManager
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest, SchedulerOutput
from engine.events import SpecMethod, StepKind
from engine.loading.loader import LoadedModel, load_model
from engine.models.build import build_model
from engine.models.layers.attention import EAGER, AttentionBackend
from engine.models.layers.linear import pack_linears, set_matmul_dtype, set_stream_kernel
from engine.models.llama import LlamaForCausalLM
from engine.models.model_config import ModelConfig
from engine.quant import int4_torch
from engine.quant.at_load import QuantizeAtLoad
from engine.quant.weight_only import original_weights, quantize_model
from engine.quant_formats import quant_format
from engine.runner.huge_pages import move_to_huge_pages
from engine.runner.model_runner import ModelRunner
from engine.runner.setup import kv_block_bytes, stream_kernel_for
from engine.sampling_params import SamplingParams


@dataclass(slots=True)
class DraftModel:
    model: LlamaForCausalLM
    config: ModelConfig

    def block_bytes(self, block_size: int, dtype: torch.dtype) -> int:
        """One KV block of the draft's own cache (it holds as many blocks as the target's)."""
        return kv_block_bytes(self.config, block_size, dtype)


def build_draft_model(cfg, target_loaded: LoadedModel, target_config: ModelConfig, device: torch.device,
                      dtype: torch.dtype, matmul_dtype: torch.dtype | None = None) -> DraftModel:
    """The draft model on the device, quantized layer by layer (a self-draft: a copy of the target, at
    self_draft_bits unless draft_quant_bits says). Built before the target's KV cache is sized: its
    weights and KV share the budget."""
    loaded = load_model(cfg.draft_model) if cfg.draft_model else target_loaded
    if loaded.config.vocab_size != target_config.vocab_size:
        raise ValueError(f"the draft model's vocabulary ({loaded.config.vocab_size}) differs from the "
                         f"target's ({target_config.vocab_size}); they must share a tokenizer")
    mc = loaded.config
    bits = cfg.draft_quant_bits or (16 if cfg.draft_model
                                    else self_draft_bits(device, dtype, mc, cfg.quant_group_size))
    # on a GPU each layer is quantized as it loads; on the CPU each is swapped in as it is made
    quantized = quant_format(bits).quantized
    at_load = QuantizeAtLoad(bits, cfg.quant_group_size) if quantized and device.type != "cpu" else None
    model = build_model(mc, loaded.state_dict, device, dtype, on_layer=at_load)
    if quantized and at_load is None:
        quantize_model(model, original_weights(model), bits, cfg.quant_group_size, install=True)
    pack_linears(model, cfg.pack_weights)  # (a quantized draft keeps only its lm_head packed)
    if device.type == "cpu":  # its weights are streamed every draft step, as the target's
        move_to_huge_pages(model)
    set_stream_kernel(model, stream_kernel_for(cfg, device, dtype))
    set_matmul_dtype(model, matmul_dtype)  # as the target's (engine/runner/cpu_compute.py)
    return DraftModel(model, mc)


def self_draft_bits(device: torch.device, dtype: torch.dtype, mc: ModelConfig, group_size: int) -> int:
    """A self-draft pays only when it is cheaper to run than the target: 4 bits where a fast int4 kernel
    runs (the CPU's native kernel; on CUDA torch's packed int4 matmul, bf16 on compute capability 8.0+),
    else 8 bits (torch's fused int8 kernel), never the 4-bit dequantize-every-call fallback."""
    if device.type != "cuda":
        return 4
    shapes = ((mc.hidden_size, mc.hidden_size), (mc.intermediate_size, mc.hidden_size),
              (mc.hidden_size, mc.intermediate_size))
    fast = all(int4_torch.applies(device, dtype, out, inp, group_size) for out, inp in shapes)
    return 4 if fast else 8


class DraftModelProposer:
    name = SpecMethod.DRAFT

    def __init__(self, model: LlamaForCausalLM, model_config: ModelConfig, num_blocks: int, block_size: int,
                 device: torch.device, dtype: torch.dtype, backend: AttentionBackend = EAGER) -> None:
        self.model = model
        self.runner = ModelRunner(model, model_config, num_blocks, block_size, device, dtype, backend)
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.computed: dict[str, int] = {}  # draft KV is valid for positions < computed[request_id]
        self._greedy = SamplingParams(temperature=0.0, max_tokens=1)

    @torch.inference_mode()
    def propose_batch(self, requests: list[Request], k: int) -> dict[str, list[int]]:
        """k greedy draft tokens per request (fewer or none when the draft cache is full)."""
        bm = self.block_manager
        shadows: list[Request] = []
        for req in requests:
            rid, tokens = req.request_id, req.all_token_ids
            if rid not in self.computed:
                if bm.allocate(rid, tokens, 0) is None:
                    continue
                self.computed[rid] = 0
            ok, _ = bm.ensure_slots(rid, self.computed[rid], len(tokens) + k - 1)
            if not ok:
                continue
            shadow = Request(rid, tokens, self._greedy)
            shadow.num_computed_tokens = self.computed[rid]
            shadows.append(shadow)
        for _ in range(k):
            if not shadows:
                break
            sched = SchedulerOutput(scheduled=[
                ScheduledRequest(s, s.num_tokens - s.num_computed_tokens,
                                 StepKind.DECODE if s.num_tokens - s.num_computed_tokens == 1 else StepKind.PREFILL)
                for s in shadows])
            result = self.runner.execute(sched, bm)
            for s, token in zip(result.order, result.sampled):
                s.request.num_computed_tokens += s.num_tokens
                s.request.output_token_ids.append(token)
        for s in shadows:
            # the last draft token was sampled but never fed back in: its KV is not in the cache
            self.computed[s.request_id] = s.num_computed_tokens
        return {s.request_id: s.output_token_ids for s in shadows}

    def rollback(self, request_id: str, num_valid_tokens: int) -> None:
        if request_id in self.computed:
            self.computed[request_id] = min(self.computed[request_id], num_valid_tokens)

    def free(self, request_id: str) -> None:
        self.block_manager.free(request_id)
        self.computed.pop(request_id, None)
