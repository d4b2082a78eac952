"""One native call per decode step (EngineConfig.fused_decode): the runner hands a batch of decodes and
chain verifies to the C++ FusedModel (engine/kernels/fused_decode.cpp), which runs the
embedding, every layer, the final norm and the lm_head, and returns the final hidden states, the logits
and each row's greedy token.

At one stream on the CPU the layer-by-layer path spends about as long dispatching ~360 small torch ops
(norms, RoPE, KV writes, casts, splits) as reading the weights; the fused step has none of that.

Which steps take it, decided once per step by `ModelRunner` (`accepts`), on a model whose every layer the
kernel can read (`FusedDecode.unsupported`: bf16 Linear layers, int8 and int4 QuantLinear layers without
16-bit outlier columns and not in reference mode, a bf16 or int8 embedding table):
- batch-invariant (EngineConfig.batch_invariant, the default) with bf16 weights: every step without a LoRA
  adapter or a draft tree, prompt chunks and any number of rows included, in one call. Each row is summed
  in one order whatever shares its step (the native bodies own their order: core/linear.h, attention.h),
  and a prompt token's K/V are those it gets as a decode, so a greedy answer is the one its prompt gets
  alone, batched, chunked, preempted and recomputed, or speculated (tests/test_batch_invariance.py);
- otherwise decodes and verify runs of a chain of drafts (speculative decoding; a tree only when it is one
  chain), no prefill chunk, no LoRA adapter, in one or two native calls of at most 8 rows (a verify run's
  rows stay in one call, where the step writes their K/V before any of them attends).
The runner builds the FusedDecode only on the CPU in bf16 with a 16-bit KV cache and a non-reference
attention backend. Everything else runs the layer-by-layer path (not batch-invariant: the library GEMM
past 8 rows, torch's attention for prompt rows), which is also what the tests hold this one to.

The plan (the C++ object holding the layers' own tensors, no copies) is built on the first eligible
step; the runner drops it whenever it drops its captured graphs (weights swapped, KV resized, released
or restored), so the next eligible step builds it again and it never keeps old weights or caches alive.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.events import ForwardPath, StepKind
from engine.models.layers.linear import Linear, LinearWrapper
from engine.models.layers.sampler import SampleResult
from engine.runner.input_batch import host_ints

FUSED_MAX_ROWS = 8  # the C++ step's scratch is sized for this many rows
FUSED_MAX_CALLS = 2  # a step of more rows takes this many native calls at most (each reads every weight once)
PATH_FUSED, PATH_LAYERS = ForwardPath.FUSED, ForwardPath.LAYERS  # what StepStats.forward_path says


def _unwrap(mod: nn.Module) -> nn.Module:
    """The projection a LoRA wrapper adds to (the fused step runs only rows without an adapter)."""
    while isinstance(mod, LinearWrapper):
        mod = mod.base
    return mod


def _proj_args(mod: nn.Module) -> tuple | str:
    """(kind, a, b, group, bias) for the kernel's Proj, or why this layer cannot be fused. Quantized layers
    (engine/quant/weight_only.py QuantLinear) say it themselves (`kernel_operands`, from their format's
    scheme in engine/quant/schemes.py): the runner lies below engine.quant and does not import it."""
    mod = _unwrap(mod)
    empty = torch.empty(0)
    if isinstance(mod, Linear):
        if mod.weight.dtype != torch.bfloat16:
            return f"a {mod.weight.dtype} Linear"
        return (0, mod.weight.detach(), empty, 0, None if mod.bias is None else mod.bias.detach())
    if hasattr(mod, "kernel_operands"):  # a quantized layer: its scheme says what the kernel reads
        operands = mod.kernel_operands()
        if isinstance(operands, str):
            return operands
        return (*operands, None if mod.bias is None else mod.bias.detach())
    return f"a {type(mod).__name__} projection"


class FusedDecode:
    """The fused decode step of one runner: `plan` keeps the C++ model in step with the Python one.
    `batch_invariant` (EngineConfig.batch_invariant): where every projection is bf16, the fused step takes
    every step it can, prompt chunks and any number of rows included, in one call (see `accepts`)."""

    def __init__(self, kernel, model: nn.Module, block_size: int, int8_activations: bool = False,
                 batch_invariant: bool = False) -> None:
        self.kernel = kernel
        self.int8_activations = int8_activations  # EngineConfig.int8_activations
        self.batch_invariant = batch_invariant
        self.model = model
        self.block_size = block_size
        self._plan = None
        self._built = False  # whether _plan is the current model's (it may be None: unsupported)
        self.unsupported: str | None = None  # why the current model cannot run fused (None: it can)
        self.all_bf16 = False  # every projection of the current plan is a bf16 Linear

    def invalidate(self) -> None:
        """Drop the plan and what it holds (old weights, released caches)."""
        self._plan, self._built, self.all_bf16 = None, False, False

    def plan(self, kv_caches):
        """The C++ model for the current modules and caches (None where they cannot run fused). Built
        once; the runner invalidates it whenever the layers or the caches change (ModelRunner.
        invalidate_graphs: weights swapped, KV resized, released or restored). Walking the modules every
        step to check would cost ~0.3 ms of a ~4 ms step."""
        if not self._built:
            self._plan, self._built = self._build(kv_caches), True
        return self._plan

    def _build(self, kv_caches):
        m, cfg = self.model, self.model.config
        self.unsupported = None
        if cfg.head_dim not in (64, 128) or cfg.num_attention_heads // cfg.num_key_value_heads > 8:
            # the attention body's cases (engine/kernels/paged_decode.cpp)
            self.unsupported = f"head_dim {cfg.head_dim} with {cfg.num_attention_heads // cfg.num_key_value_heads} " \
                               "query heads per KV head (the kernel: 64 or 128, at most 8)"
            return None
        emb = m.embed_tokens
        if hasattr(emb, "qweight") and hasattr(emb, "scales"):  # engine/quant/embeddings.py Int8Embedding
            table, scales = emb.qweight, emb.scales
        elif isinstance(emb, nn.Embedding) and emb.weight.dtype == torch.bfloat16:
            table, scales = emb.weight.detach(), None
        else:
            self.unsupported = f"a {type(emb).__name__} embedding"
            return None
        if len(kv_caches) != len(m.layers) or any(k.dtype != torch.bfloat16 for k, _ in kv_caches):
            self.unsupported = "an 8-bit KV cache"
            return None
        mods = [m.lm_head]
        for layer in m.layers:
            a = layer.self_attn
            mods += [a.qkv_proj, a.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj]
        args = [_proj_args(x) for x in mods]
        bad = next((a for a in args if isinstance(a, str)), None)
        if bad is not None:
            self.unsupported = bad
            return None
        self.all_bf16 = all(a[0] == 0 for a in args)
        try:
            return self._make(table, scales, args, kv_caches)
        except RuntimeError as exc:  # a shape the kernel does not take: this model runs layer by layer
            self.unsupported = str(exc).splitlines()[0]
            return None

    def _make(self, table, scales, args, kv_caches):
        m, cfg = self.model, self.model.config
        projs = [self.kernel.Proj(*a) for a in args]
        plan = self.kernel.FusedModel(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                      cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps, table, scales,
                                      m.norm.weight.detach(), projs[0], m.rotary.cos, m.rotary.sin)
        for i, (layer, (k, v)) in enumerate(zip(m.layers, kv_caches)):
            a = layer.self_attn
            plan.add_layer(layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach(),
                           None if a.q_norm is None else a.q_norm.weight.detach(),
                           None if a.k_norm is None else a.k_norm.weight.detach(),
                           *projs[1 + 4 * i : 5 + 4 * i], k, v)
        plan.set_int8_activations(self.int8_activations)
        return plan

    @staticmethod
    def greedy_result(greedy: list[int | None] | None, producers) -> SampleResult | None:
        """The sampler's result for the producing rows straight from the step's greedy tokens, where every
        one of them is greedy without logprobs (else None: the sampler runs). A row whose logits are not
        finite fails, as sample() fails it. producers: (scheduled request, row) pairs."""
        if greedy is None or any(not s.request.sampling_params.greedy or s.request.sampling_params.logprobs is not None
                                 for s, _ in producers):
            return None
        tokens = [greedy[r] for _, r in producers]
        return SampleResult(tokens, [None] * len(tokens), [j for j, t in enumerate(tokens) if t is None])

    @staticmethod
    def eligible(order) -> bool:
        """Decodes and verifies of a chain of drafts (`_chain`), none of them with a LoRA adapter, that fit
        in at most FUSED_MAX_CALLS calls of at most FUSED_MAX_ROWS rows, each request's rows in one call."""
        if not order or any(s.request.lora_id != 0 for s in order):
            return False
        for s in order:
            if s.kind == StepKind.DECODE and s.num_tokens == 1:
                continue
            if s.kind != StepKind.VERIFY or s.num_tokens > FUSED_MAX_ROWS or not _chain(s.request.spec_tree,
                                                                                  s.num_tokens - 1):
                return False
        return len(_calls(order)) <= FUSED_MAX_CALLS

    def accepts(self, order) -> bool:
        """Whether the current plan takes this step. Batch-invariant over a bf16 plan: every step without a
        LoRA adapter or a draft tree, prompt chunks and any number of rows included, in one call, so a row's
        numbers are those it has alone (each row summed in one order whatever its company: the native bodies
        own their order), and a prompt's K/V those its tokens get as decodes (a preempted request recomputes
        them to the bit). Else what `eligible` takes."""
        if not (self.batch_invariant and self.all_bf16):
            return self.eligible(order)
        return bool(order) and all(s.request.lora_id == 0 and (s.kind != StepKind.VERIFY or _chain(
            s.request.spec_tree, s.num_tokens - 1)) for s in order)

    def run(self, plan, order, bm, block_rows, logit_rows: list[int]) -> tuple[torch.Tensor, torch.Tensor,
                                                                               list[int | None]]:
        """(final hidden (n, hidden) bf16, logits (len(logit_rows), vocab) float32, greedy tokens) of a batch
        `accepts` takes, one row per token in `order`'s order; logits and greedy tokens of the rows
        `logit_rows` (ascending) only: per row the first index of its largest logit, None where a logit is
        NaN or infinite (taken in the same pass that writes the logits, so greedy rows need no torch op after
        the step). A verify run's rows are its last known token and its drafts, a prompt chunk's its tokens,
        at consecutive positions: the native step writes every row's K/V before any row attends (`chained`).
        block_rows: the runner's padding of block tables into one flat int64 tensor (ModelRunner._block_rows)."""
        parts = [order] if self.batch_invariant and self.all_bf16 else _calls(order)
        outs, first = [], 0
        for part in parts:
            n = sum(s.num_tokens for s in part)
            mine = [r - first for r in logit_rows if first <= r < first + n]
            outs.append(self._call(plan, part, bm, block_rows, mine))
            first += n
        if len(outs) == 1:
            return outs[0]
        return (torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs]), [t for o in outs for t in o[2]])

    def _call(self, plan, order, bm, block_rows, logit_rows: list[int]):
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        lens: list[int] = []
        tables: list = []
        for s in order:
            req = s.request
            p = req.num_computed_tokens
            end = p + s.num_tokens
            table = bm.block_table(req.request_id)
            if s.kind == StepKind.VERIFY:  # the last known token, then the drafts being checked
                ids += req.token_slice(p, req.num_tokens) + req.spec_token_ids[: end - req.num_tokens]
            else:  # a decode's newest token, or a prompt chunk's tokens
                ids += req.token_slice(p, end)
            pos += range(p, end)
            slots += (table[q // bs] * bs + q % bs for q in range(p, end))
            lens += range(p + 1, end + 1)
            tables.append(table)
        width = max(-(-n // bs) for n in lens)
        # each request's padded block table once, repeated for its rows (a prompt chunk has hundreds)
        rows = block_rows(tables, width).view(len(order), width).repeat_interleave(
            torch.tensor([s.num_tokens for s in order]), dim=0)
        chained = len(ids) > len(order)
        every = logit_rows == list(range(len(ids)))
        hidden, logits, greedy = plan.step(host_ints(ids), host_ints(pos), host_ints(slots), rows, host_ints(lens), bs,
                                           chained, None if every else host_ints(logit_rows))
        return hidden, logits, [t if t >= 0 else None for t in greedy.tolist()]


def _chain(parents, drafts: int) -> bool:
    """Whether a verify run's drafts form a chain: no tree (n-gram, a draft model), or a tree whose every
    draft's parent is the row just before it (multi-token prediction's heads at width 1)."""
    return not parents or all(p == i for i, p in enumerate(parents[:drafts]))


def _calls(order) -> list[list]:
    """`order` cut, in order, into native calls of at most FUSED_MAX_ROWS rows, no request split."""
    calls: list[list] = [[]]
    rows = 0
    for s in order:
        if rows + s.num_tokens > FUSED_MAX_ROWS:
            calls.append([])
            rows = 0
        calls[-1].append(s)
        rows += s.num_tokens
    return calls
