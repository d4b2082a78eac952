"""What one engine step costs, counted from the shapes it ran: FLOPs and bytes moved (pure functions).

Counted, per step (T = tokens run, summed over the scheduled requests):

  FLOPs
    linears   2 * P_lin * T           P_lin: the weights of every layer's q/k/v/o and gate/up/down
    attention 4 * L * H * d * keys    QK^T and PV, 2 FLOPs per multiply-add each; `keys` sums, over every
                                      new token, the positions it attends to (causal: c + i + 1 for the
                                      i-th of n new tokens after c cached ones)
    lm_head   2 * D * V * rows        rows: the positions that produce logits (the last token of a
                                      request that reaches its end; every position of a verify run)

  bytes
    weights   every layer's weights once per step (quantized layers: their packed integers and scales),
              the lm_head once when any row is sampled, one embedding row per token
    KV        read: every cached and new position of each scheduled request, once (c + n tokens);
              written: the n new positions
    activations each linear's input and output once per token ((D + qkv + H*d + D + D + 2*I + I + D)
              * bytes per activation per layer) and the logits rows (float32)

What it leaves out (small at these shapes, and not counted rather than guessed): norms, RoPE, the
sampler, softmax passes. MTP trees and speculative verification are counted as causal chains.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The architecture facts step costs depend on, and the bytes the current weights take."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    layer_weight_bytes: int  # every decoder layer together (+ final norm), as stored now
    lm_head_bytes: int
    embed_row_bytes: int  # one row of the embedding table
    act_bytes: int = 2  # bytes per activation (bf16)
    kv_bytes: int = 2  # bytes per K or V element

    @property
    def linear_params(self) -> int:
        """Multiply-adds per token in one pass through every layer's linears."""
        d, hd = self.hidden_size, self.head_dim
        qkv = d * (self.num_heads + 2 * self.num_kv_heads) * hd
        o = self.num_heads * hd * d
        mlp = 3 * d * self.intermediate_size  # gate, up, down
        return self.num_layers * (qkv + o + mlp)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes

    @property
    def activation_bytes_per_token(self) -> int:
        d, i, hd = self.hidden_size, self.intermediate_size, self.head_dim
        qkv = (self.num_heads + 2 * self.num_kv_heads) * hd
        per_layer = d + qkv + self.num_heads * hd + d + d + 2 * i + i + d
        return self.num_layers * per_layer * self.act_bytes


@dataclass(frozen=True, slots=True)
class RequestWork:
    """One scheduled request in one step."""

    num_tokens: int  # new positions run this step
    num_cached: int  # positions already in the KV cache before this step
    logit_rows: int  # positions that go through the lm_head


@dataclass(frozen=True, slots=True)
class StepCost:
    linear_flops: int
    attention_flops: int
    lm_head_flops: int
    weight_bytes: int
    kv_read_bytes: int
    kv_write_bytes: int
    activation_bytes: int

    @property
    def flops(self) -> int:
        return self.linear_flops + self.attention_flops + self.lm_head_flops

    @property
    def bytes_moved(self) -> int:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.activation_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved (arithmetic intensity)."""
        return self.flops / self.bytes_moved if self.bytes_moved else 0.0


def attended_keys(num_tokens: int, num_cached: int) -> int:
    """Sum over the new tokens of the positions each attends to: n*c + n(n+1)/2."""
    return num_tokens * num_cached + num_tokens * (num_tokens + 1) // 2


def step_cost(shape: ModelShape, work: Iterable[RequestWork]) -> StepCost:
    """FLOPs and bytes of one step that ran `work` (see the module docstring for what is counted)."""
    totals = WorkTotals()
    for w in work:
        totals.add(w.num_tokens, w.num_cached, w.logit_rows)
    return totals_cost(shape, totals)


@dataclass(slots=True)
class WorkTotals:
    """A step's RequestWork summed: what its cost depends on (StepCounter adds them up as it goes)."""

    tokens: int = 0  # new positions
    keys: int = 0  # attended_keys over the requests
    rows: int = 0  # logit rows
    kv_read_tokens: int = 0  # positions read from the KV cache (cached + new)

    def add(self, num_tokens: int, num_cached: int, logit_rows: int) -> None:
        self.tokens += num_tokens
        self.keys += attended_keys(num_tokens, num_cached)
        self.rows += logit_rows
        self.kv_read_tokens += num_cached + num_tokens


def totals_cost(shape: ModelShape, totals: WorkTotals) -> StepCost:
    """step_cost of the work these totals sum."""
    tokens, keys, rows, kv_read_tokens = totals.tokens, totals.keys, totals.rows, totals.kv_read_tokens
    if tokens == 0:
        return StepCost(0, 0, 0, 0, 0, 0, 0)
    return StepCost(
        linear_flops=2 * shape.linear_params * tokens,
        attention_flops=4 * shape.num_layers * shape.num_heads * shape.head_dim * keys,
        lm_head_flops=2 * shape.hidden_size * shape.vocab_size * rows,
        weight_bytes=shape.layer_weight_bytes + (shape.lm_head_bytes if rows else 0)
        + shape.embed_row_bytes * tokens,
        kv_read_bytes=shape.kv_bytes_per_token * kv_read_tokens,
        kv_write_bytes=shape.kv_bytes_per_token * tokens,
        activation_bytes=shape.activation_bytes_per_token * tokens + rows * shape.vocab_size * 4,
    )
