"""Turning logits into tokens: greedy, temperature, top-k, top-p, per-request RNG, logprobs.

Numerically safe for every SamplingParams that validates: temperature divides logits that were first
shifted so each row's maximum is 0 (so a tiny temperature sends the rest to -inf instead of overflowing
to inf - inf = NaN, and a huge one flattens them towards 0), the top-ranked token always survives top-k
and top-p, and top_k is clamped to the vocabulary. A row whose logits are not finite (NaN or inf from
the model) is never sampled: it is reported in `failed`, so its request fails alone instead of
emitting a silent token (argmax over NaN is token 0) or making a draw over NaN probabilities for the batch.
Where the CPU's native module runs (ModelRunner.rows_kernel), each row's check and token come from one native
call (engine/kernels/sample_rows.cpp): a greedy row's in one pass, a row sampled at its temperature alone (no
top-k, no top-p: those keep torch's sort) in three, from the same uniform number draw_rows would take.
Otherwise the check is two vectorised reductions a row, not a
comparison of every logit and its reduction: a row is finite when its maximum and its minimum are (NaN
propagates through both; +inf is a maximum, -inf a minimum). For a greedy row the maximum is its token's
logit (argmax returns the first NaN where there is one), for a sampled row the one the temperature's shift
reads anyway.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import torch

from engine.kernels.gpu.launches import transfer
from engine.models.layers.read_back import float_bits, floats_from_bits, to_host
from engine.sampling_params import SamplingParams

# On the CPU a row's argmax runs as a chunked max (vectorised) and an argmax over the winning chunk:
# ~10x faster than torch's argmax over 64 rows of a 49,152-token vocabulary (2-core Zen 4, 1 thread; 256 columns
# a chunk: 290 us there, 390 us at 1024, 720 us at 2048).
ARGMAX_CHUNK = 256
_CHUNK_COLUMNS = torch.arange(ARGMAX_CHUNK)


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int | None]  # None for a failed row
    # Per row, when logprobs were asked for: (logprob of the sampled token, [(id, logprob), ...] top-n)
    logprobs: list[tuple[float, list[tuple[int, float]]] | None]
    failed: list[int] = field(default_factory=list)  # rows whose logits were not finite
    extra: list[int] = field(default_factory=list)  # the caller's `extra`, read back with the tokens


def scale_by_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """(logits - row max) / temperature for logits (n, vocab) and temperature (n,) > 0: every value is
    <= 0 and each row's top one exactly 0, whatever the temperature's magnitude."""
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    return shifted / temperature.unsqueeze(1)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits: (n, vocab), already divided by temperature. top_k 0 and top_p 1 mean off."""
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab).unsqueeze(1)
    drop = ranks >= k
    probs = sorted_logits.masked_fill(drop, -torch.inf).softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token if the mass before it already does.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= top_p.unsqueeze(1)
    drop[:, 0] = False  # the most likely token always survives (a row is never all -inf)
    sorted_logits = sorted_logits.masked_fill(drop, -torch.inf)
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)


def _cuts(p: SamplingParams) -> bool:
    """Whether top-k or top-p cut the row's distribution (a sort of the row)."""
    return bool(p.top_k) or p.top_p < 1.0


def shape_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits (n, vocab), one row per params[i] (none greedy) -> the logits each row samples from: scaled
    by temperature, then cut by top-k and top-p. The sampler and speculative verification (engine/spec/
    verify.py) both read it, so a sampling knob that reshapes the distribution is written here once."""
    dev = logits.device
    logits = scale_by_temperature(logits, torch.tensor([p.temperature for p in params], device=dev))
    if any(_cuts(p) for p in params):
        top_k = torch.tensor([p.top_k for p in params], device=dev)
        top_p = torch.tensor([p.top_p for p in params], device=dev)
        logits = apply_top_k_top_p(logits, top_k, top_p)
    return logits


def noise_seed(seed: int, num_tokens: int) -> int:
    """The Triton sampler's per-row noise seed (engine/kernels/gpu/sampling.py) for a request's seed and its
    token count: a seeded request draws the same tokens every run."""
    return hash((seed, num_tokens)) & 0x7FFFFFFF


def _kernel_params(params: list[SamplingParams], seeds: list[int], device: torch.device) -> list[torch.Tensor]:
    """Temperature (float32), top-k (int32), top-p (float32) and noise seed (int32) of every row, in one copy to
    the device: float32 values travel as their bits in one int32 tensor."""
    n = len(params)
    floats = struct.unpack(f"{2 * n}i", struct.pack(f"{2 * n}f", *(p.temperature for p in params),
                                                    *(p.top_p for p in params)))
    ints = [*floats[:n], *(min(p.top_k, 2**31 - 1) for p in params), *floats[n:], *seeds]
    packed = torch.tensor(ints, dtype=torch.int32)
    transfer("sampling_params")
    if device.type == "cuda":
        packed = packed.pin_memory()
    packed = packed.to(device, non_blocking=True)
    return [packed[:n].view(torch.float32), packed[n : 2 * n], packed[2 * n : 3 * n].view(torch.float32),
            packed[3 * n :]]


def row_argmax(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(each row's argmax, the logit there) of logits (n, vocab), exactly torch's argmax: the first maximum,
    or the first NaN in a row that has one. On the CPU as a chunked max and an argmax within the first
    chunk holding the row's maximum (ARGMAX_CHUNK)."""
    n, vocab = logits.shape
    k = vocab // ARGMAX_CHUNK
    if logits.device.type != "cpu" or k < 2:
        idx = logits.argmax(dim=-1)
        return idx, logits.gather(1, idx.unsqueeze(1)).squeeze(1)
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    chunk_max = logits[:, : k * ARGMAX_CHUNK].view(n, k, ARGMAX_CHUNK).amax(dim=-1)  # NaN propagates
    if k * ARGMAX_CHUNK < vocab:
        chunk_max = torch.cat([chunk_max, logits[:, k * ARGMAX_CHUNK :].amax(dim=-1, keepdim=True)], dim=1)
    start = chunk_max.argmax(dim=-1, keepdim=True) * ARGMAX_CHUNK  # the first chunk holding the maximum (or NaN)
    # the last chunk may be short: its window repeats the last column, after the real ones
    cols = start + _CHUNK_COLUMNS
    if k * ARGMAX_CHUNK < vocab:
        cols.clamp_(max=vocab - 1)
    within = logits.gather(1, cols).argmax(dim=-1, keepdim=True)
    return (start + within).squeeze(1), chunk_max.amax(dim=-1)  # the row's maximum is its token's logit


def draw_rows(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token a row of probs (n, vocab), by the inverse of the row's cumulative distribution: one uniform
    number a row from its request's own generator (its seed: the same draws every run), the first token whose
    cumulative mass passes that share of the row's total. Cumulated in float64, so a token's mass is its own
    to ~1e-16 and one of zero probability is never drawn. torch.multinomial drew 49,152 exponential numbers a
    row for the same one token (~1.0 ms a row on a 2-core Zen 4, 1 thread; this: ~3.3 ms for 64 rows)."""
    dev = probs.device
    u = torch.stack([torch.rand((), dtype=torch.float64, generator=g, device=g.device if g is not None else dev)
                     for g in generators]).to(dev)
    mass = probs.to(torch.float64).cumsum_(dim=-1)
    return torch.searchsorted(mass, (u * mass[:, -1]).unsqueeze(1), right=True).squeeze(1)


def _greedy_and_failed(logits: torch.Tensor, params: list[SamplingParams],
                       native=None) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """The torch path's (each greedy row's token, a stand-in elsewhere; each row's failed flag; the sampled rows).
    A row fails where its maximum or its minimum is not finite (see the module docstring). `native`: the CPU's
    native module (engine/kernels/sample_rows.cpp), one pass a row for both; when every row is greedy its -1
    tokens are the flags (None)."""
    n = logits.shape[0]
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if native is not None and logits.dtype == torch.float32 and logits.device.type == "cpu":
        tokens = native.greedy_rows(logits if logits.stride(-1) == 1 else logits.contiguous())
        return tokens, tokens < 0 if rows else None, rows
    if len(rows) < n:  # greedy rows: the first maximum, NaN first
        chosen, peak = row_argmax(logits)
    else:
        chosen = torch.empty(n, dtype=torch.long, device=logits.device)
    if rows:  # each row's maximum (for a greedy row the same number: its token's logit, or NaN)
        peak = logits.amax(dim=-1)
    return chosen, torch.stack((peak, logits.amin(dim=-1))).isfinite().all(dim=0).logical_not(), rows


def _native_rows(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
                 native) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """_greedy_and_failed's result from the CPU's native module's sample_rows: every row's check, each greedy
    row's token and each row sampled at its temperature alone (no top-k, no top-p) drawn in the same pass
    (engine/kernels/core/rows.h sampled_token), its uniform number from its request's generator as draw_rows
    takes it (the same draws: a seeded request's tokens do not depend on the path). The rows left to the torch
    path are those cut by top-k or top-p (a sort of the row)."""
    n = logits.shape[0]
    rows = [i for i, p in enumerate(params) if not p.greedy and _cuts(p)]
    temps, u = [0.0] * n, [0.0] * n
    for i, p in enumerate(params):
        if not p.greedy and not _cuts(p):
            temps[i] = p.temperature
            u[i] = torch.rand((), dtype=torch.float64, generator=generators[i]).item()
    tokens = native.sample_rows(logits if logits.stride(-1) == 1 else logits.contiguous(),
                                torch.tensor(temps, dtype=torch.float32), torch.tensor(u, dtype=torch.float64))
    return tokens, tokens < 0 if rows else None, rows


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None], extra: torch.Tensor | None = None,
           kernels=None, seeds: list[int] | None = None, native=None) -> SampleResult:
    """logits: (n, vocab) float32, one row per request that produces a token this step. `extra`: (m,)
    integers on the same device that the caller wants on the host too (SampleResult.extra), in the same
    copy (the runner's verify rows).

    Everything runs where the logits are; the host reads the results back once, logprobs included (as
    float32 bit patterns in the same integer copy): no per-row .item(), which on a GPU would wait for the
    device once per request.

    `kernels` (the CUDA path's Triton kernels, engine/kernels/gpu): every row sampled and checked in one kernel
    (greedy, temperature, top-k, top-p), its noise keyed by `seeds` (noise_seed of each row's request) instead of
    the generators. `native`: the CPU's native module: its sample_rows checks every row and takes each greedy row's
    token and each temperature-only row's draw in one call (_native_rows), or, when every row is greedy, its
    greedy_rows (_greedy_and_failed)."""
    n = logits.shape[0]
    bad: torch.Tensor | None
    if kernels is not None:
        drawn = kernels.sample(logits, *_kernel_params(params, seeds or [0] * n, logits.device))
        chosen, bad, rows = drawn[:n], drawn[n:], []
    elif (native is not None and hasattr(native, "sample_rows") and logits.dtype == torch.float32
          and logits.device.type == "cpu" and any(not p.greedy for p in params)):  # (all greedy: greedy_rows)
        chosen, bad, rows = _native_rows(logits, params, generators, native)
    else:
        chosen, bad, rows = _greedy_and_failed(logits, params, native)
    if rows:
        assert bad is not None  # (the flags of sampled rows are their own tensor: draws overwrite the tokens)
        sub = logits[rows]  # a copy: stand-in zeros keep a failed row's batched ops finite
        sub.masked_fill_(bad[rows].unsqueeze(1), 0.0)
        probs = shape_logits(sub, [params[i] for i in rows]).softmax(dim=-1)
        chosen[rows] = draw_rows(probs, [generators[i] for i in rows])  # stays on the device, one op
    want = [i for i, p in enumerate(params) if p.logprobs is not None]
    # (torch.cat makes the flags integers); flags None: a -1 token is its row's flag
    ints = [drawn] if kernels is not None else [chosen] if bad is None else [chosen, bad]
    head = len(ints) * n if kernels is None else 2 * n  # tokens (and flags) first
    if want:
        lp = logits[want].log_softmax(dim=-1)
        top_n = min(max(max(params[i].logprobs for i in want), 1), logits.shape[-1])
        top_vals, top_ids = lp.topk(top_n, dim=-1)
        chosen_lp = lp.gather(1, chosen[want].clamp(min=0).unsqueeze(1)).squeeze(1)  # (a failed row's -1)
        ints.append(top_ids.flatten())
        ints.append(float_bits(torch.cat([chosen_lp, top_vals.flatten()])))
    if extra is not None:
        ints.append(extra.long())
    host = to_host(torch.cat(ints) if len(ints) > 1 else ints[0])  # the one copy back
    floats: list[float] = []
    if want:  # after the tokens, the failed flags and the top ids
        start = head + len(want) * top_n
        floats = floats_from_bits(host[start : start + len(want) * (top_n + 1)])
    token_ids: list[int | None] = host[:n]
    flags = host[n:head] if head > n else [t < 0 for t in host[:n]]
    failed = [i for i, bad_row in enumerate(flags) if bad_row] if any(flags) else []
    for i in failed:
        token_ids[i] = None
    logprobs: list[tuple[float, list[tuple[int, float]]] | None] = [None] * n
    for j, i in enumerate(want):
        if i in failed:
            continue
        k = params[i].logprobs
        ids = host[head + j * top_n : head + j * top_n + k]
        vals = floats[len(want) + j * top_n : len(want) + j * top_n + k]
        logprobs[i] = (floats[j], list(zip(ids, vals)))
    extra_host = host[len(host) - extra.numel():] if extra is not None else []
    return SampleResult(token_ids, logprobs, failed, extra_host)
