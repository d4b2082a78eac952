"""Build a Llama-family model from loaded weights, the one way both the target and a draft model are
built: fused q/k/v and gate/up filled from Hugging Face names, the RoPE cos/sin tables kept in float32
(a bf16 table would round every rotation angle to 8 bits of mantissa).

Meta-device init, piece by piece: the module tree is made on the `meta` device (no memory), then each
piece (the embedding table, each decoder layer, the final norm, the lm_head) is materialized on the
target device directly in the target dtype, filled from the checkpoint, and handed to `on_layer`
before the next piece is made. Nothing is built in float32 on the host first, and a hook that
quantizes each layer as it arrives (engine/quant/at_load.py) keeps the device's peak at the quantized
model plus one 16-bit layer: 4 bits fit where bf16 does not."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.models.layers.rotary import RotaryEmbedding
from engine.models.llama import LlamaForCausalLM
from engine.models.model_config import ModelConfig

OnLayer = Callable[[LlamaForCausalLM, int], None]  # (model, decoder layer index), once each layer is filled
# (model, piece): where the piece's parameters, just made (empty), should lie before they are filled
Allocate = Callable[[nn.Module, nn.Module], None]


def build_model(model_config: ModelConfig, state_dict: dict[str, torch.Tensor], device: torch.device,
                dtype: torch.dtype, on_layer: OnLayer | None = None,
                allocate: Allocate | None = None) -> LlamaForCausalLM:
    """`allocate`: called with each piece once it is made and before it is filled (the engine points the
    large weights into one huge-page arena there: engine/runner/huge_pages.ArenaPlan)."""
    mc = model_config
    with torch.device("meta"):
        model = LlamaForCausalLM(mc, max_positions=mc.max_position_embeddings)
    # the tables are computed (float32, on the host), never materialized from meta
    model.rotary = RotaryEmbedding(mc.head_dim, mc.max_position_embeddings, mc.rope_theta, mc.rope_scaling).to(device)
    by_piece = _split_by_piece(state_dict)
    loaded: set[str] = set()
    _fill(model, model.embed_tokens, by_piece.pop("embed_tokens", {}), device, dtype, loaded, allocate)
    for i, layer in enumerate(model.layers):
        _fill(model, layer, by_piece.pop(f"layers.{i}", {}), device, dtype, loaded, allocate)
        if on_layer is not None:
            on_layer(model, i)
    _fill(model, model.norm, by_piece.pop("norm", {}), device, dtype, loaded, allocate)
    if mc.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight  # materializing the table broke the meta tie
        by_piece.pop("lm_head", None)
    else:
        _fill(model, model.lm_head, by_piece.pop("lm_head", {}), device, dtype, loaded, allocate)
    leftover = {name: t for piece in by_piece.values() for name, t in piece.items()}
    model.load_weights(leftover, check_missing=False)  # raises for a tensor with no place in the model
    model.check_loaded(loaded)
    return model.eval()


def _split_by_piece(state_dict: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Checkpoint tensors grouped by the piece they fill: 'embed_tokens', 'layers.3', 'norm', 'lm_head'."""
    pieces: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in state_dict.items():
        parts = name.removeprefix("model.").split(".")
        key = ".".join(parts[:2]) if parts[0] == "layers" and len(parts) > 2 else parts[0]
        pieces.setdefault(key, {})[name] = tensor
    return pieces


def _fill(model: LlamaForCausalLM, piece: nn.Module, tensors: dict[str, torch.Tensor], device: torch.device,
          dtype: torch.dtype, loaded: set[str], allocate: Allocate | None = None) -> None:
    """Materialize `piece` on the device in `dtype` (its memory taken only now) and copy its tensors in."""
    piece.to(dtype=dtype)  # on meta: free
    piece.to_empty(device=device)  # (empty: no page is touched before `allocate` may move it)
    if allocate is not None:
        allocate(model, piece)
    loaded |= model.load_weights(tensors, check_missing=False)
