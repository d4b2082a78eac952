"""Llama-family decoder over a paged KV cache: Llama 2/3, SmolLM, Mistral, Qwen2 (q/k/v bias) and
Qwen3 (RMSNorm on q and k per head). What differs is read from ModelConfig, never from a name.

The forward pass takes a flat, unpadded batch: (num_tokens,) token ids with their positions, mixing
prefill chunks and decode tokens of different requests; AttentionMetadata says who is who.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.layers.attention import (
    AttentionMetadata,
    paged_attention_fast,
    paged_attention_reference,
    write_kv,
)
from engine.layers.linear import Linear, silu_and_mul
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.model_config import ModelConfig


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
        self.reference = False

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding,
                kv_cache: tuple[torch.Tensor, torch.Tensor], md: AttentionMetadata) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(positions, q, k)
        k_cache, v_cache = kv_cache
        write_kv(k_cache, v_cache, k, v, md.slot_mapping)
        if self.reference:
            o = paged_attention_reference(q, k_cache, v_cache, md, self.scale)
        else:
            o = paged_attention_fast(q, k, v, k_cache, v_cache, md, self.scale)
        return self.o_proj(o.reshape(n, self.q_size))


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

    def forward(self, x, residual, positions, rotary, kv_cache, md):
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm.forward_add(x, residual)
        x = self.self_attn(x, positions, rotary, kv_cache, md)
        x, residual = self.post_attention_layernorm.forward_add(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def set_compiled(self, on: bool) -> None:
        """torch.compile (or stop compiling) the dense parts of every layer: norms, projections, RoPE,
        MLP, where elementwise chains fuse into single kernels. Attention stays eager: its inputs are
        paged and ragged. Compiled in place (`Module.compile`), so the module tree and its names stay
        the same and a requantization can still swap layers (the next call recompiles). Shapes are
        dynamic, so a new batch size does not recompile; the first calls after switching on compile."""
        dense = [m for layer in self.layers for m in (layer.mlp, layer.input_layernorm,
                                                       layer.post_attention_layernorm)] + [self.norm]
        for m in dense:
            if on:
                m.compile(dynamic=True)
            else:
                m._compiled_call_impl = None  # Module.compile's hook: None calls forward eagerly

    @property
    def compiled(self) -> bool:
        return self.norm._compiled_call_impl is not None

    def set_attention_backend(self, backend: str) -> None:
        for layer in self.layers:
            layer.self_attn.reference = backend == "reference"

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], md: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: (num_tokens,). Returns final hidden states (num_tokens, hidden)."""
        x = self.embed_tokens(input_ids)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, positions, self.rotary, kv_cache, md)
        x, _ = self.norm.forward_add(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()  # (n, vocab)

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy Hugging Face-named tensors in, fusing q/k/v and gate/up."""
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
                self._copy_shard(params[pname], tensor, target, shard)
            else:
                pname = name
                if pname not in params:
                    raise KeyError(f"checkpoint tensor {name!r} has no place in the model")
                params[pname].copy_(tensor)
            loaded.add(pname)
        missing = set(params) - loaded - ({"lm_head.weight"} if self.config.tie_word_embeddings else set())
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
        param[start : start + sizes[shard]].copy_(tensor)
