"""Llama-family decoder over a paged KV cache: Llama 2/3, SmolLM, Mistral, Qwen2 (q/k/v bias) and
Qwen3 (RMSNorm on q and k per head). What differs is read from ModelConfig, never from a name.

The forward pass takes a flat, unpadded batch: (num_tokens,) token ids with their positions, mixing
prefill chunks and decode tokens of different requests; AttentionMetadata says who is who.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.models.layers.attention import (
    AttentionMetadata,
    paged_attention_fast,
    paged_attention_reference,
    write_kv,
)
from engine.models.layers.gemv import CompiledGemv
from engine.models.layers.linear import PROMPT_ROWS, Linear, silu_and_mul
from engine.models.layers.norm import RMSNorm
from engine.models.layers.rotary import RotaryEmbedding
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

    def project(self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding):
        """x (n, hidden) -> q (n, heads, head_dim), k and v (n, kv_heads, head_dim), RoPE applied."""
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(positions, q, k)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               kv_cache: tuple[torch.Tensor, torch.Tensor], md: AttentionMetadata) -> torch.Tensor:
        """Write k, v into the paged cache and attend over it: (n, heads * head_dim), before o_proj."""
        k_cache, v_cache = kv_cache
        write_kv(k_cache, v_cache, k, v, md.slot_mapping)
        if md.backend.reference:  # the path is the runner's one AttentionBackend, not a flag per layer
            o = paged_attention_reference(q, k_cache, v_cache, md, self.scale)
        else:
            o = paged_attention_fast(q, k, v, k_cache, v_cache, md, self.scale)
        return o.reshape(q.shape[0], self.q_size)


def compile_like_eager(fn):
    """torch.compile with dynamic shapes, keeping eager's bf16 roundings between the ops it fuses
    (inductor's emulate_precision_casts): without them a fused region kept fp32 intermediates, and on
    SmolLM2-135M greedy answers parted from eager's within 16-24 tokens in 2 of 4 requests. With them,
    RMSNorm's sum in float64 (engine/models/layers/norm.py) and the library GEMM an opaque call
    (linear.library_linear), a compiled region computes the same bits as the eager layers."""
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

        # the dense code between two attentions runs as one call (compiled by set_compiled): the
        # forward pass alternates attend -> post_then_pre; the next layer is set by the model. The
        # compiled callables exist only while compiling: an eager layer holds no bound method of itself,
        # so dropping the model frees its memory at once instead of waiting for the garbage collector.
        self._compiled: tuple | None = None  # (pre_attention, post_then_pre) compiled
        object.__setattr__(self, "_next", None)  # not a submodule: names and state_dict stay the same

    def _pre(self, x, residual, positions, rotary, compiled: bool):
        fn = self._compiled[0] if compiled and self._compiled is not None else self.pre_attention
        return fn(x, residual, positions, rotary)

    def _post_pre(self, o, residual, positions, rotary, compiled: bool):
        fn = self._compiled[1] if compiled and self._compiled is not None else self.post_then_pre
        return fn(o, residual, positions, rotary)

    def pre_attention(self, x, residual, positions, rotary):
        """Everything before the paged attention: add & norm, q/k/v projection, RoPE."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm.forward_add(x, residual)
        q, k, v = self.self_attn.project(x, positions, rotary)
        return q, k, v, residual

    def post_attention(self, o, residual):
        """Everything after it: o_proj, add & norm, the MLP."""
        x, residual = self.post_attention_layernorm.forward_add(self.self_attn.o_proj(o), residual)
        return self.mlp(x), residual

    def post_then_pre(self, o, residual, positions, rotary):
        """This layer's post_attention, then the next layer's pre_attention."""
        x, residual = self.post_attention(o, residual)
        return self._next.pre_attention(x, residual, positions, rotary)

    def set_compiled(self, on: bool) -> None:
        self._compiled = ((compile_like_eager(self.pre_attention), compile_like_eager(self.post_then_pre))
                          if on else None)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.compiled = False  # set_compiled
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        for layer, nxt in zip(self.layers, self.layers[1:]):
            object.__setattr__(layer, "_next", nxt)
        self._compiled_finish = None  # set_compiled (eager: no bound method of itself kept)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def set_compiled(self, on: bool) -> None:
        """torch.compile (or stop compiling) the dense code between two paged attentions (o_proj, add &
        norm, MLP, the next layer's norm, q/k/v and RoPE: one compiled call per layer instead of dozens
        of small kernels; plus the first layer's prologue and the final norm), and give every 16-bit
        Linear the single-row kernel (engine/models/layers/gemv.py: decode of one stream is bound by reading
        the weights, which the library kernel does at half the bandwidth; inside a compiled region its
        math is traced instead). The paged attention stays eager: its inputs are ragged. The module
        tree and its names stay the same, so a requantization still swaps layers (the next call
        recompiles). Shapes are dynamic (one row is its own graph); the first calls after switching on
        compile.
        Only steps without prompt rows (decodes, verifies) run compiled, as servers capture only their
        decode steps: prompt rows take the library GEMM (linear.PROMPT_ROWS, a flag a compiled graph cannot
        read), and in a compiled region inductor folded a GEMM and the residual add into one addmm,
        rounded once, so a prompt's K/V and then greedy answers parted from eager's. A prefill step is
        bound by its matrix products, which compiling leaves as they are."""
        for layer in self.layers:
            layer.set_compiled(on)
        self._compiled_finish = compile_like_eager(self.finish) if on else None
        kernel = CompiledGemv() if on else None
        for m in self.modules():
            if isinstance(m, Linear):
                m.gemv = kernel
        self.compiled = on

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], md: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: (num_tokens,). Returns final hidden states (num_tokens, hidden)."""
        # The same computation as calling each DecoderLayer in turn, cut at the attentions instead of at
        # the layers, so the dense code between two attentions is one (compiled) call.
        compiled = self.compiled and not PROMPT_ROWS.get()  # steps with prompt rows run eager: see set_compiled
        q, k, v, residual = self.layers[0]._pre(self.embed_tokens(input_ids), None, positions, self.rotary, compiled)
        last = len(self.layers) - 1
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            o = layer.self_attn.attend(q, k, v, kv_cache, md)
            if i < last:
                q, k, v, residual = layer._post_pre(o, residual, positions, self.rotary, compiled)
        finish = self._compiled_finish if compiled and self._compiled_finish is not None else self.finish
        return finish(o, residual)

    def finish(self, o: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The last layer's post_attention and the final norm."""
        x, residual = self.layers[-1].post_attention(o, residual)
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
