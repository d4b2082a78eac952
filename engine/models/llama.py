"""Llama-family decoder over a paged KV cache: Llama 2/3, SmolLM, Mistral, Qwen2 (q/k/v bias) and
Qwen3 (RMSNorm on q and k per head). What differs is read from ModelConfig, never from a name.

The forward pass takes a flat, unpadded batch: (num_tokens,) token ids with their positions, mixing
prefill chunks and decode tokens of different requests; AttentionMetadata says who is who.
"""
from __future__ import annotations

import torch
from torch import nn
from torch._dynamo.decorators import mark_unbacked

from engine.models.layers.attention import AttentionMetadata, paged_attention_triton
from engine.models.layers.attention_op import STEP_METADATA, attend_paged, paged_attend
from engine.models.layers.gemv import CompiledGemv
from engine.models.layers.linear import PROMPT_ROWS, STREAM_MAX_ROWS, Linear, silu_and_mul
from engine.models.layers.norm import RMSNorm
from engine.models.layers.rotary import RotaryEmbedding, apply_rope
from engine.models.model_config import ModelConfig


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        # q, k and v projections fused into one matmul.
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = self.head_dim**-0.5

    def project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """x (n, hidden) -> q (n, heads, head_dim), k and v (n, kv_heads, head_dim), RoPE applied (`rope`:
        the step's tables, RotaryEmbedding.tables)."""
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, k, rope)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               kv_cache: tuple[torch.Tensor, torch.Tensor], md: AttentionMetadata | None) -> torch.Tensor:
        """Write k, v into the paged cache and attend over it: (n, heads * head_dim), before o_proj. In a
        compiled forward pass (md None) one opaque op that reads the step's metadata when it runs."""
        if md is None:
            return paged_attend(q, k, v, kv_cache[0], kv_cache[1], self.scale)
        return attend_paged(q, k, v, kv_cache[0], kv_cache[1], md, self.scale)


def compile_like_eager(fn):
    """torch.compile with dynamic shapes, keeping eager's bf16 roundings between the ops it fuses
    (inductor's emulate_precision_casts): without them a fused region kept fp32 intermediates, and on
    SmolLM2-135M greedy answers parted from eager's within 16-24 tokens in 2 of 4 requests. With them,
    RMSNorm's sum in float64 (engine/models/layers/norm.py) and the library GEMM an opaque call
    (linear.library_linear), a compiled region computes the same bits as the eager layers.
    Python floats (each RMSNorm's eps) are traced as constants (dynamo's specialize_float, process-wide:
    every region we compile holds only constant floats). Traced as symbols, they failed inductor's
    tensorify pass, which restarted the whole trace: 21 of a cold compile's 77 s (SmolLM2-135M, 2 rows)."""
    torch._dynamo.config.specialize_float = True
    return torch.compile(fn, dynamic=True, options={"emulate_precision_casts": True})


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size)  # gate and up fused
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: tuple[torch.Tensor, torch.Tensor],
                md: AttentionMetadata | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Add & norm, q/k/v and RoPE, the paged attention, o_proj, add & norm, the MLP: (x, residual)."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm.forward_add(x, residual)
        q, k, v = self.self_attn.project(x, rope)
        o = self.self_attn.attend(q, k, v, kv_cache, md)
        x, residual = self.post_attention_layernorm.forward_add(self.self_attn.o_proj(o), residual)
        return self.mlp(x), residual

    def forward_triton(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                       rotary: RotaryEmbedding, kv_cache: tuple[torch.Tensor, torch.Tensor], md: AttentionMetadata,
                       kernels) -> tuple[torch.Tensor, torch.Tensor]:
        """The same layer on the CUDA path (engine/kernels/gpu): add & norm, the q/k/v product, RoPE with the
        K/V write, the paged attention, o_proj, add & norm, the gate/up product, SwiGLU, the down product:
        five Triton kernels (six with a long context's split merge) and four library products. The
        projections are this layer's own modules (a LoRA wrapper or a quantized layer computes as it does
        on every path)."""
        attn, eps = self.self_attn, self.input_layernorm.eps
        x, residual = kernels.add_rms_norm(x, self.input_layernorm.weight, eps, residual)
        q_norm, k_norm = (attn.q_norm.weight, attn.k_norm.weight) if attn.q_norm is not None else (None, None)
        cos, sin = rotary.whole_tables(x.dtype)
        q = kernels.rope_and_cache(attn.qkv_proj(x), positions, cos, sin, md.slot_mapping,
                                   kv_cache[0], kv_cache[1], attn.num_heads, attn.num_kv_heads, attn.head_dim,
                                   q_norm, k_norm, attn.q_norm.eps if q_norm is not None else eps)
        o = paged_attention_triton(q, kv_cache[0], kv_cache[1], md, attn.scale)
        x, residual = kernels.add_rms_norm(attn.o_proj(o.view(o.shape[0], -1)), self.post_attention_layernorm.weight,
                                           self.post_attention_layernorm.eps, residual)
        return self.mlp.down_proj(kernels.silu_and_mul(self.mlp.gate_up_proj(x))), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.compiled = False  # set_compiled
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        # the compiled forward pass exists only while compiling: an eager model holds no bound method of
        # itself, so dropping it frees its memory at once instead of waiting for the garbage collector
        self._compiled_forward = None
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def set_compiled(self, on: bool) -> None:
        """torch.compile (or stop compiling) the forward pass as ONE region: every layer's norms, q/k/v,
        RoPE, o_proj and MLP fused into a few kernels per layer, the paged attention an opaque op in it
        (engine/models/layers/attention_op.py: its inputs are ragged). One call per step: each call of a
        compiled region costs a guard check and a wrapper (measured at ~0.2-0.4 ms on the 2-core test
        machine), which at one region per layer ate what the fusing saved. Every 16-bit Linear also gets
        the single-row kernel (engine/models/layers/gemv.py) for where there is no native kernel. The
        module tree and its names stay the same, so a requantization still swaps layers (the next call
        recompiles). Shapes are dynamic; the first calls after switching on compile.
        Only steps without prompt rows (decodes, verifies) run compiled, as servers capture only their
        decode steps: prompt rows take the library GEMM (linear.PROMPT_ROWS, a flag a compiled graph cannot
        read), and a prefill step is bound by its matrix products, which compiling leaves as they are."""
        self._compiled_forward = compile_like_eager(self.layers_forward) if on else None
        kernel = CompiledGemv() if on else None
        for m in self.modules():
            if isinstance(m, Linear):
                m.gemv = kernel
        self.compiled = on

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], md: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: (num_tokens,). Returns final hidden states (num_tokens, hidden)."""
        if self._compiled_forward is None or PROMPT_ROWS.get():  # steps with prompt rows run eager: see set_compiled
            return self.layers_forward(input_ids, positions, kv_caches, md)
        if input_ids.shape[0] <= STREAM_MAX_ROWS and self.lm_head.stream is not None:
            # 1 to 8 rows, one graph: dynamo would specialise 1 row apart (a second compile of the whole
            # region, as long as the first: 146 -> 55 s of a cold warm-up as AVX2 with the float fix,
            # compile_like_eager). The rows' count stays a symbol known to lie in 1-8, so every Linear
            # takes the streaming kernel without a guard; more rows compile a graph of their own. Not
            # without the native kernel: there 1 row takes the compiled gemv, which needs the count.
            mark_unbacked(input_ids, 0, min=1, max=STREAM_MAX_ROWS)
            mark_unbacked(positions, 0, min=1, max=STREAM_MAX_ROWS)
        token = STEP_METADATA.set(md)  # what the attention op reads (the graph cannot take it)
        try:
            return self._compiled_forward(input_ids, positions, kv_caches, None)
        finally:
            STEP_METADATA.reset(token)

    def layers_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                       md: AttentionMetadata | None) -> torch.Tensor:
        """The layers and the final norm (md None: in the compiled region, see Attention.attend)."""
        x, residual = self.embed_tokens(input_ids), None
        kernels = md.backend.triton if md is not None else None
        if kernels is not None:  # the CUDA path: DecoderLayer.forward_triton
            for layer, kv_cache in zip(self.layers, kv_caches):
                x, residual = layer.forward_triton(x, residual, positions, self.rotary, kv_cache, md, kernels)
            return kernels.add_rms_norm(x, self.norm.weight, self.norm.eps, residual)[0]
        rope = self.rotary.tables(positions, x.dtype)  # once for every layer
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, rope, kv_cache, md)
        return self.norm.forward_add(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()  # (n, vocab)

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor], check_missing: bool = True) -> set[str]:
        """Copy Hugging Face-named tensors in, fusing q/k/v and gate/up; returns the parameter names
        filled. `check_missing=False`: a part of the checkpoint (build_model fills piece by piece)."""
        params = dict(self.named_parameters())
        fused = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
                 "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
        loaded: set[str] = set()
        for name, tensor in state_dict.items():
            name = name.removeprefix("model.")
            if "rotary_emb" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            parts = name.split(".")
            if len(parts) >= 2 and parts[-2] in fused:
                target, shard = fused[parts[-2]]
                pname = ".".join(parts[:-2] + [target, parts[-1]])
                if pname not in params:
                    raise KeyError(f"checkpoint tensor {name!r} has no place in the model")
                self._copy_shard(params[pname], tensor, target, shard)
            else:
                pname = name
                if pname not in params:
                    raise KeyError(f"checkpoint tensor {name!r} has no place in the model")
                if tensor.shape != params[pname].shape:  # copy_ would broadcast some mismatches silently
                    raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                                     f"the model expects {tuple(params[pname].shape)}")
                params[pname].copy_(tensor)
            loaded.add(pname)
        if check_missing:
            self.check_loaded(loaded)
        return loaded

    def check_loaded(self, loaded: set[str]) -> None:
        """KeyError naming the parameters no checkpoint tensor filled."""
        params = {n for n, _ in self.named_parameters(remove_duplicate=False)}
        missing = params - loaded - ({"lm_head.weight"} if self.config.tie_word_embeddings else set())
        if missing:
            raise KeyError(f"checkpoint lacks {sorted(missing)[:5]}")

    def _copy_shard(self, param: torch.Tensor, tensor: torch.Tensor, target: str, shard: int) -> None:
        cfg = self.config
        if target == "gate_up_proj":
            sizes = [cfg.intermediate_size] * 2
        else:  # qkv
            kv = cfg.num_key_value_heads * cfg.head_dim
            sizes = [cfg.num_attention_heads * cfg.head_dim, kv, kv]
        start = sum(sizes[:shard])
        want = (sizes[shard], *param.shape[1:])
        if tuple(tensor.shape) != want:
            raise ValueError(f"checkpoint tensor for {target} part {shard} has shape {tuple(tensor.shape)}, "
                             f"the model expects {want}")
        param[start : start + sizes[shard]].copy_(tensor)
