"""Build a Llama-family model from loaded weights, the one way both the target and a draft model are
built: fused q/k/v and gate/up filled from Hugging Face names, moved to the device and dtype, the RoPE
cos/sin tables kept in float32 (a bf16 table would round every rotation angle to 8 bits of mantissa)."""
from __future__ import annotations

import torch

from engine.models.llama import LlamaForCausalLM
from engine.models.model_config import ModelConfig


def build_model(model_config: ModelConfig, state_dict: dict[str, torch.Tensor], device: torch.device,
                dtype: torch.dtype) -> LlamaForCausalLM:
    model = LlamaForCausalLM(model_config, max_positions=model_config.max_position_embeddings)
    model.load_weights(state_dict)
    model = model.to(device=device, dtype=dtype).eval()
    model.rotary.cos, model.rotary.sin = model.rotary.cos.float(), model.rotary.sin.float()
    return model
