"""StepCounter: the engine's one hook into step_cost. It notes the shapes of a step when it is
scheduled (the KV context each request starts from is only known then: verification rolls back) and
counts FLOPs and bytes when the step's stats are built."""
from __future__ import annotations

from torch import nn

from engine.events import StepKind
from engine.models.model_config import ModelConfig
from engine.perf.step_cost import ModelShape, WorkTotals, totals_cost
from engine.runner.memory import unique_tensor_bytes


def storage_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers, each once (packed copies are not tensors of the
    module: the step reads either the packed copy or the weight, not both)."""
    return unique_tensor_bytes(list(module.parameters()) + list(module.buffers()))


def model_shape(model: nn.Module, mc: ModelConfig, act_bytes: int) -> ModelShape:
    layers = storage_bytes(model.layers) + storage_bytes(model.norm)
    return ModelShape(
        hidden_size=mc.hidden_size, intermediate_size=mc.intermediate_size, num_layers=mc.num_hidden_layers,
        num_heads=mc.num_attention_heads, num_kv_heads=mc.num_key_value_heads, head_dim=mc.head_dim,
        vocab_size=mc.vocab_size, layer_weight_bytes=layers, lm_head_bytes=storage_bytes(model.lm_head),
        embed_row_bytes=storage_bytes(model.embed_tokens) // mc.vocab_size, act_bytes=act_bytes,
        kv_bytes=act_bytes)


class StepCounter:
    def __init__(self, model_config: ModelConfig, act_bytes: int) -> None:
        self._mc, self._act_bytes = model_config, act_bytes
        self._shape: ModelShape | None = None
        self._shape_key: int | None = None
        self._work = WorkTotals()

    def begin(self, sched) -> None:
        """Note each scheduled request's shape (before the step runs and moves num_computed_tokens), summed."""
        work = WorkTotals()
        for s in sched.scheduled:
            req = s.request
            if s.kind == StepKind.VERIFY:
                rows = s.num_tokens
            else:
                rows = 1 if req.num_computed_tokens + s.num_tokens == req.num_tokens else 0
            work.add(s.num_tokens, req.num_computed_tokens, rows)
        self._work = work

    def count(self, model: nn.Module, weights_key: int) -> tuple[int, int]:
        """(FLOPs, bytes moved) of the step noted by begin(); weights_key changes when the weights do."""
        if self._shape is None or weights_key != self._shape_key:
            self._shape, self._shape_key = model_shape(model, self._mc, self._act_bytes), weights_key
        cost = totals_cost(self._shape, self._work)
        self._work = WorkTotals()
        return cost.flops, cost.bytes_moved
