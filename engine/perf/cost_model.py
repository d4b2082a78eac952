"""Predicted points: larger models on datacenter GPUs, from a cost model calibrated on this machine.

The calibration is this machine's measured efficiency against its own probed roofs: the median
fraction of the measured bandwidth that decode steps achieved, and of the measured peak FLOP/s that
prefill steps achieved (both from the counted FLOPs and bytes of the sweep's steps). The prediction
assumes the same efficiencies on the target device, which is the weakest link and why every point
says "predicted". Per (model, device, weight format, batch), at a context of CONTEXT_TOKENS per request:

    weights   = linear params x the format's bits / 8 (+ scales: int8 and fp8 one 16-bit scale per row, int4 group 32 a
                16-bit scale and zero per 32 weights, i.e. +1 bit) + 16-bit embeddings and lm_head
    KV        = (device memory x MEMORY_SHARE - weights) / KV bytes per token (16-bit KV)
    decode step = max((weights + batch x context x KV/token) / (bandwidth x eff_mem),
                      2 x params x batch / (peak x eff_compute))
    prefill ceiling = peak x eff_compute / (2 x params)   tokens/s
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from engine.events import StepKind
from engine.perf.roofline import Roofs
from engine.quant_formats import QUANT_FORMAT_NAMES, quant_format

CONTEXT_TOKENS = 1024
MEMORY_SHARE = 0.90


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    name: str
    bf16_flops: float  # dense, no sparsity
    bandwidth: float  # bytes/s
    memory_bytes: int


# Public datasheet constants (NVIDIA A100 80GB SXM, H100 SXM5 80GB, H200 SXM 141GB): dense bf16 tensor
# FLOP/s, HBM bandwidth, memory. Not measured here.
DEVICES = (
    DeviceSpec("A100", 312e12, 2.039e12, 80 * 10**9),
    DeviceSpec("H100", 989e12, 3.35e12, 80 * 10**9),
    DeviceSpec("H200", 989e12, 4.8e12, 141 * 10**9),
)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def linear_params(self) -> int:
        hd = self.hidden // self.heads
        per_layer = self.hidden * (self.heads + 2 * self.kv_heads) * hd + self.hidden * self.hidden \
            + 3 * self.hidden * self.intermediate
        return self.layers * per_layer

    @property
    def embed_params(self) -> int:
        return 2 * self.vocab * self.hidden  # untied embedding table and lm_head

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * (self.hidden // self.heads) * 2


# Public architecture configs: Llama-2-7B and Llama-3-70B (config.json on the Hugging Face Hub).
MODELS = (
    ModelSpec("7B", 4096, 11008, 32, 32, 32, 32000),
    ModelSpec("70B", 8192, 28672, 80, 64, 8, 128256),
)


@dataclass(frozen=True, slots=True)
class Efficiency:
    """This machine's measured efficiency against its own roofs (fractions)."""

    memory: float  # decode steps: achieved bytes/s / probed bandwidth (median)
    compute: float  # prefill steps: achieved FLOP/s / probed peak (median)
    decode_steps: int
    prefill_steps: int


def calibrate(roofs: Roofs, steps: list[tuple[str, int, int, float]]) -> Efficiency | None:
    """steps: (kind, flops, bytes, wall) of measured steps. None without both kinds."""
    mem = [b / w / roofs.bandwidth_bytes_per_s for k, f, b, w in steps if k == StepKind.DECODE and w > 0 and b > 0]
    comp = [f / w / roofs.flops_roof() for k, f, b, w in steps if k == StepKind.PREFILL and w > 0 and f > 0]
    if not mem or not comp:
        return None
    return Efficiency(min(1.0, statistics.median(mem)), min(1.0, statistics.median(comp)), len(mem), len(comp))


def weights_bytes(model: ModelSpec, fmt: str) -> int:
    form = quant_format(fmt)
    extra_bits = form.overhead_bits(model.hidden)  # scales (see the module docstring)
    return int(model.linear_params * (form.bits + extra_bits) / 8) + model.embed_params * 2


def predict(model: ModelSpec, device: DeviceSpec, fmt: str, batch: int, eff: Efficiency,
            price_per_hour: float) -> dict:
    """One predicted point (plain JSON-able dict, "predicted": True)."""
    weights = weights_bytes(model, fmt)
    free = device.memory_bytes * MEMORY_SHARE - weights
    kv_tokens = int(free // model.kv_bytes_per_token) if free > 0 else 0
    point = {"model": model.name, "device": device.name, "quant_format": fmt, "max_num_seqs": batch,
             "num_speculative_tokens": 0,
             "predicted": True, "weights_bytes": weights, "kv_capacity_tokens": kv_tokens,
             "context_tokens": CONTEXT_TOKENS, "fits": kv_tokens >= batch * CONTEXT_TOKENS,
             "efficiency_memory": eff.memory, "efficiency_compute": eff.compute,
             "prefill_tokens_per_s_ceiling": device.bf16_flops * eff.compute / (2 * model.linear_params),
             "ppl_delta_pct": None, "kl": None, "agreement": None}
    if not point["fits"]:
        point.update(tokens_per_s_user=None, tokens_per_s_total=None, usd_per_mtok=None)
        return point
    t_mem = (weights + batch * CONTEXT_TOKENS * model.kv_bytes_per_token) / (device.bandwidth * eff.memory)
    t_compute = 2 * model.linear_params * batch / (device.bf16_flops * eff.compute)
    step = max(t_mem, t_compute)
    total = batch / step
    point.update(tokens_per_s_user=1 / step, tokens_per_s_total=total,
                 usd_per_mtok=price_per_hour / (total * 3600) * 1e6,
                 decode_bound="memory" if t_mem >= t_compute else "compute")
    return point


def predicted_points(eff: Efficiency, price_per_hour: float, batches: tuple[int, ...] = (1, 32)) -> list[dict]:
    return [predict(m, d, fmt, b, eff, price_per_hour)
            for m in MODELS for d in DEVICES for fmt in QUANT_FORMAT_NAMES for b in batches]
