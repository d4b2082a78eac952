"""A layer's paged attention (K/V write + attention) as one opaque op, so that a whole forward pass can be
one compiled region (engine/models/llama.py, compile=True): the attention reads ragged metadata (a
dataclass of block tables and decode groups) and calls native kernels, neither of which a graph can hold.

The step's metadata travels beside the graph, not through it: the caller sets STEP_METADATA around the
compiled call and the op reads it when it runs (vLLM's "forward context" does the same). The op runs
exactly the eager layer's code (`attend_paged`), so a compiled step computes the same numbers.
"""
from __future__ import annotations

from contextvars import ContextVar

import torch

from engine.models.layers.attention import (
    AttentionMetadata,
    paged_attention_fast,
    paged_attention_reference,
    write_kv,
)

# The metadata of the forward pass now running in this thread (set by LlamaForCausalLM.forward).
STEP_METADATA: ContextVar[AttentionMetadata | None] = ContextVar("inferlab_step_metadata", default=None)


def attend_paged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 md: AttentionMetadata, scale: float) -> torch.Tensor:
    """Write k, v into the paged cache and attend over it: q (n, heads, head_dim) -> (n, heads * head_dim)."""
    write_kv(k_cache, v_cache, k, v, md.slot_mapping)
    if md.backend.reference:  # the path is the runner's one AttentionBackend, not a flag per layer
        o = paged_attention_reference(q, k_cache, v_cache, md, scale)
    else:
        o = paged_attention_fast(q, k, v, k_cache, v_cache, md, scale)
    return o.reshape(q.shape[0], -1)


@torch.library.custom_op("inferlab::paged_attend", mutates_args=("k_cache", "v_cache"))
def paged_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """attend_paged with the step's metadata (STEP_METADATA), as a compiled graph calls it."""
    md = STEP_METADATA.get()
    if md is None:
        raise RuntimeError("inferlab::paged_attend ran outside a forward pass (no step metadata set)")
    return attend_paged(q, k, v, k_cache, v_cache, md, scale)


@paged_attend.register_fake
def _(q, k, v, k_cache, v_cache, scale):
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
