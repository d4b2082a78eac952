"""Turns a SchedulerOutput into tensors, runs the model and samples. Owns the KV cache tensors and the
attention backend (chosen by engine/runner/attention_backend.py; every step's metadata carries it to
the layers).

It never decides who runs: it executes exactly what the scheduler handed out.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from engine.core.block_manager import BlockManager
from engine.core.scheduler import ScheduledRequest, SchedulerOutput
from engine.events import AttentionBackendName, ForwardPath, KvCacheDtype, StepKind
from engine.models.layers.attention import (
    EAGER,
    AttentionBackend,
    AttentionMetadata,
    DecodeGroup,
    PrefillBatch,
    PrefillSeq,
)
from engine.models.layers.kv_quant import SCALE_BYTES
from engine.models.layers.linear import INT8_ROWS, PROMPT_ROWS
from engine.models.llama import LlamaForCausalLM
from engine.models.model_config import ModelConfig
from engine.runner.attention_backend import select_backend
from engine.runner.fused import PATH_FUSED, PATH_LAYERS, FusedDecode
from engine.runner.graphs import DecodeGraphs
from engine.runner.input_batch import BlockTables, decode_inputs, host_ints
from engine.runner.step_result import NONFINITE, StepResult, producing_rows, read_back_step, take_verifies

# Decodes whose context lengths lie within this ratio share one padded attention call. Tighter means
# less padding gathered (the gather dominates decode steps on the CPU) but more, smaller calls.
DECODE_GROUP_RATIO = 2.0
# All-decode steps of at least this many rows read the block tables kept across steps (engine/runner/
# input_batch.py); fewer rows build theirs from lists, which costs no more there. _prepare, lists against
# kept tables (2-core Zen 4, 1 thread): 1 row 28 against 41 us; 16 rows 51-60 against 53-58; 32 rows 85-104
# against 75-84; 64 rows 133 against 92 us at 18 tokens of context, 307 against 184 at 1,000.
KEPT_TABLES_MIN_ROWS = 16


def kv_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A KV cache tensor, every page written now. On ordinary pages, not huge ones (the weights' arena is):
    with THP's defrag at "madvise" each 2 MiB page advised MADV_HUGEPAGE may make the kernel compact memory
    when it is first touched. Left to the steps, those faults stalled a 49-token step 1.5 s; written at
    allocation, 720 MiB of advised pages took 0.1-7 s depending on the memory's state, where torch.zeros
    takes ~0.3 s every time (2-core Zen 4, 1 thread)."""
    return torch.zeros(shape, dtype=dtype, device=device)


def tree_depths(parents: list[int]) -> list[int]:
    """Depth of each row of a draft tree whose row 0 is the last known token and row i + 1 the draft
    with parent row parents[i] (parents come first)."""
    depth = [0]
    for p in parents:
        depth.append(depth[p] + 1)
    return depth


def tree_layout(parents: list[int], device: torch.device) -> tuple[list[int], torch.Tensor]:
    """(depth of each row, (rows, rows) ancestor-or-self mask) of a draft tree (see tree_depths)."""
    mask = torch.eye(len(parents) + 1, dtype=torch.bool)
    for i, p in enumerate(parents, start=1):
        mask[i] |= mask[p]
    return tree_depths(parents), mask.to(device)


def rows_kernel(backend: AttentionBackend, fused: FusedDecode | None):
    """The native module whose greedy_rows / sample_rows the sampler takes each row's check and token with, in one
    call (engine/kernels/sample_rows.cpp): the build the step's fused path or decode attention runs already (none
    is built for it), not the portable tier (its scalar pass is slower than torch's vectorised reductions),
    never on the readable reference path."""
    if backend.reference:
        return None
    for module in (fused.kernel if fused is not None else None, backend.native_decode):
        if module is not None and hasattr(module, "greedy_rows") and module.tier() != "portable":
            return module
    return None


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, model_config: ModelConfig, num_blocks: int, block_size: int,
                 device: torch.device, dtype: torch.dtype, backend: AttentionBackend = EAGER,
                 kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO, matmul_dtype: torch.dtype | None = None) -> None:
        self.model = model
        self.cfg = model_config
        self.device, self.dtype = device, dtype
        self.block_size = block_size
        self.keep_hidden = False  # set while MTP heads need the final hidden states
        self.lora = None  # the engine's LoraPool when it has one: binds each row of a batch to its adapter
        # the speculative decoder's (ScheduledRequest, logits (n, vocab)) -> (m,) integer tensor of a verify's
        # decisions on the device, read back with the step's sampled tokens (engine/spec/decoder.py)
        self.verify_decisions = None
        # fp32 on a CPU without native bf16 (engine/runner/cpu_compute.py): the eager attention's products
        self.matmul_dtype = matmul_dtype
        self.backend = dataclasses.replace(backend, matmul_dtype=matmul_dtype) if matmul_dtype else backend
        self.graphs: DecodeGraphs | None = None  # EngineConfig.cuda_graphs: all-decode steps replayed
        self._parked_graphs: DecodeGraphs | None = None  # graphs switched off, kept for switching on (park_graphs)
        # EngineConfig.fused_decode: decode and chain-verify steps in native calls (engine/runner/fused.py)
        self.fused: FusedDecode | None = None
        self.rows_kernel = None  # the sampler's native greedy rows (rows_kernel), where a native module runs
        # EngineConfig.int8_activations: the fused step's products, and quantized layers' many rows (INT8_ROWS)
        self.int8_activations = False
        self.last_path = ForwardPath.NONE  # which path the last step ran (StepStats.forward_path)
        self.kernel_family = "bf16"  # the weights' kernel family: which measured tier the fused step runs
        # int8: rows of head_dim int8 values + their float32 scale (engine/models/layers/kv_quant.py)
        self.kv_int8 = kv_cache_dtype == KvCacheDtype.INT8
        # One (K, V) pair of flat slot tensors per layer, each (kv_heads, num_blocks * block_size, head_dim
        # [+ the scale's bytes when int8]).
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.restore_kv(num_blocks)
        self.block_tables = BlockTables()  # decode rows' tables kept across steps (engine/runner/input_batch.py)
        self._positions = torch.arange(0)  # the eager decode masks' column positions (_decode_groups)

    def set_execution(self, attention_backend: AttentionBackendName, compile: bool,
                      progress: Callable[[str, float], None] | None = None, fused_decode: bool = False,
                      int8_activations: bool = False, wait_kernels: bool = True,
                      batch_invariant: bool = False) -> None:
        """How the model runs (at start-up, and again when compile switches): compile=True compiles the
        model's dense regions and gives it the single-row kernel; the attention backend is (re-)selected
        for that (compile=True adds the gather-fused decode attention unless the readable reference path
        was asked for). What is compiled is compiled lazily, by the next steps.
        `fused_decode`: decode and chain-verify steps run as native calls (engine/runner/fused.py) where it applies:
        bf16 on the CPU, a 16-bit KV cache, not the reference backend, not compile=True (which asked for
        the compiled path), no CUDA-graph buffers; `int8_activations`: its 4- and 8-bit products with
        int8 activations (EngineConfig.int8_activations), and quantized layers' many rows where no native
        bf16 GEMM applies (engine/quant/schemes.py int8_many_rows); `wait_kernels=False`: the native kernels only where
        they are built already (EngineConfig.kernel_build "background"); `batch_invariant`: the fused step takes
        every step it can, prompt chunks and any number of rows (engine/runner/fused.py accepts)."""
        self.model.set_compiled(compile)
        self.int8_activations = int8_activations
        self.invalidate_graphs()
        backend = select_backend(attention_backend, self.cfg, self.device, self.dtype, compile, progress,
                                 previous=self.backend, wait=wait_kernels)
        if self.kv_int8:  # the decode kernels read 16-bit caches: an 8-bit one decodes on the eager path
            backend = dataclasses.replace(backend, native_decode=None, compiled_decode=None, flex=None, triton=None)
        if self.matmul_dtype is not None:
            backend = dataclasses.replace(backend, matmul_dtype=self.matmul_dtype)
        self.backend = backend
        self.fused = None
        if (fused_decode and not compile and not backend.reference and not self.kv_int8 and backend.triton is None
                and self.device.type == "cpu" and self.dtype == torch.bfloat16):
            from engine.kernels import fused_decode_kernel

            # the build of the weights' kernel family (engine/kernels/tier_choice.py); None where not built
            kernel = fused_decode_kernel(progress, wait=wait_kernels, family=self.kernel_family)
            if kernel is not None:
                self.fused = FusedDecode(kernel, self.model, self.block_size, int8_activations, batch_invariant)
        self.rows_kernel = rows_kernel(backend, self.fused)

    @property
    def native_decode(self):
        """The C++ paged-decode module the backend runs decodes with, or None."""
        return self.backend.native_decode

    def park_graphs(self, on: bool) -> DecodeGraphs | None:
        """Switch the decode graphs off (kept, as captured) or on again (the kept ones, if any: a bench that
        alternates modes captures once, not once a round). Returns the graphs now on, or None."""
        if on and self.graphs is None:
            self.graphs, self._parked_graphs = self._parked_graphs, None
        elif not on and self.graphs is not None:
            self._parked_graphs, self.graphs = self.graphs, None
        return self.graphs

    def invalidate_graphs(self) -> None:
        """Captured graphs read the K/V tensors and weights they were recorded with: drop them when
        either changes (the next decode steps capture again; parked ones too)."""
        self._parked_graphs = None
        if self.graphs is not None:
            self.graphs.invalidate()
        if self.fused is not None:  # it holds the layers' tensors and the caches too
            self.fused.invalidate()

    def resize_kv(self, num_blocks: int) -> None:
        """New K/V tensors of `num_blocks` blocks; the slots both sizes share are copied over."""
        self.invalidate_graphs()
        keep = min(num_blocks * self.block_size, self.kv_caches[0][0].shape[1])
        for i, (k, v) in enumerate(self.kv_caches):  # layer by layer: the peak is one layer's extra copy
            shape = (k.shape[0], num_blocks * self.block_size, k.shape[2])
            k2, v2 = kv_zeros(shape, k.dtype, k.device), kv_zeros(shape, v.dtype, v.device)
            k2[:, :keep], v2[:, :keep] = k[:, :keep], v[:, :keep]
            self.kv_caches[i] = (k2, v2)
            del k, v

    def release_kv(self) -> int:
        """Free the K/V tensors (a rebuild makes the next engine in their memory); returns the block
        count restore_kv gives back. The runner cannot run until then."""
        blocks = self.kv_caches[0][0].shape[1] // self.block_size if self.kv_caches else 0
        self.invalidate_graphs()
        self.kv_caches = []
        return blocks

    def restore_kv(self, num_blocks: int) -> None:
        """Zeroed K/V tensors of num_blocks blocks (after release_kv; what they held is gone)."""
        shape = (self.cfg.num_key_value_heads, num_blocks * self.block_size,
                 self.cfg.head_dim + (SCALE_BYTES if self.kv_int8 else 0))
        kv_dtype = torch.int8 if self.kv_int8 else self.dtype
        self.invalidate_graphs()
        self.kv_caches = [(kv_zeros(shape, kv_dtype, self.device), kv_zeros(shape, kv_dtype, self.device))
                          for _ in range(self.cfg.num_hidden_layers)]

    @property
    def kv_cache_bytes(self) -> int:
        return sum(k.numel() * k.element_size() * 2 for k, _ in self.kv_caches)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        bs = self.block_size
        for src, dst in copies:
            for k, v in self.kv_caches:
                k[:, dst * bs : (dst + 1) * bs] = k[:, src * bs : (src + 1) * bs]
                v[:, dst * bs : (dst + 1) * bs] = v[:, src * bs : (src + 1) * bs]

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, bm: BlockManager) -> StepResult:
        if sched.block_copies:
            self.copy_blocks(sched.block_copies)
        # Decodes first, shortest context first (so similar lengths sit together), then prefill chunks.
        decodes = sorted((s for s in sched.scheduled if s.kind == StepKind.DECODE), key=lambda s: s.request.num_tokens)
        order = decodes + [s for s in sched.scheduled if s.kind != StepKind.DECODE]
        rows, producers, verify_spans = producing_rows(order)
        plan = self._fused_plan(order)
        all_logits = greedy = None
        if plan is not None:  # the whole step in one native call: hidden states, the rows' logits and argmax
            hidden, all_logits, greedy = self.fused.run(plan, order, bm, self._block_rows, rows)
            self.last_path = PATH_FUSED
        else:
            hidden = self.forward(order, bm)
            self.last_path = PATH_LAYERS
        sampled: list[int | None] = [None] * len(order)
        logprobs: list = [None] * len(order)
        step = StepResult(order, sampled, logprobs, 0)
        if rows:
            every_row = rows == list(range(hidden.shape[0]))  # every row produces (decodes, verifies): no copy
            row_hidden = hidden if every_row else hidden[rows]
            if all_logits is not None:  # the fused step's: of `rows` only
                logits = all_logits
            else:
                logits = self.model.compute_logits(row_hidden)
            where = {id(s): i for i, s in enumerate(order)}
            result, verify_host, sizes = read_back_step(logits, producers, verify_spans, greedy,
                                                        self.verify_decisions, self.backend.triton, self.rows_kernel)
            if result is not None and len(producers) == len(order):  # every request, in order (all decodes)
                sampled[:], logprobs[:] = result.token_ids, result.logprobs
                step.failed.update({j: NONFINITE for j in result.failed})
            elif result is not None:
                for (s, _), tok, lp in zip(producers, result.token_ids, result.logprobs):
                    sampled[where[id(s)]] = tok
                    logprobs[where[id(s)]] = lp
                step.failed.update({where[id(producers[j][0])]: NONFINITE for j in result.failed})
            take_verifies(step, where, logits, verify_spans, verify_host, sizes)
            for i in step.failed:  # stale NaN K/V must not reach another request through a padded gather
                self.clear_written_slots(order[i], bm)
            if self.keep_hidden:
                step.hidden = {where[id(s)]: row_hidden[r : r + 1] for s, r in producers}
                step.hidden.update({where[id(s)]: row_hidden[first : first + n] for s, first, n in verify_spans})
        step.activation_bytes = hidden.numel() * hidden.element_size() * (
            4 + 2 * self.cfg.intermediate_size // self.cfg.hidden_size)
        return step

    def _fused_plan(self, order: list[ScheduledRequest]):
        """The fused step's plan when this batch takes it (see engine/runner/fused.py), else None."""
        if self.fused is None or self.graphs is not None:
            return None
        plan = self.fused.plan(self.kv_caches)
        return plan if plan is not None and self.fused.accepts(order) else None

    def clear_written_slots(self, s: ScheduledRequest, bm: BlockManager) -> None:
        """Zero the K/V slots this step wrote for a request that failed (its own fresh positions,
        never a shared prefix block): they may hold NaN, and a padded decode gather of another request
        reads whole blocks, where 0 attention weight times NaN would still be NaN."""
        req, bs = s.request, self.block_size
        table = bm.block_table(req.request_id)
        start = req.num_computed_tokens
        slots = [table[p // bs] * bs + p % bs for p in range(start, start + s.num_tokens) if p // bs < len(table)]
        if slots:
            index = torch.tensor(slots, device=self.device)
            for k, v in self.kv_caches:
                k.index_fill_(1, index, 0.0)
                v.index_fill_(1, index, 0.0)

    def forward(self, order: list[ScheduledRequest], bm: BlockManager) -> torch.Tensor:
        """Final hidden states (num_tokens, hidden) of the flat batch, decodes first."""
        if self.graphs is not None and self.graphs.eligible(self, order):
            return self.graphs.run(self, order, bm)
        input_ids, positions, md = self._prepare(order, bm)
        # prompt rows take the library GEMM however few (engine/models/layers/linear.py PROMPT_ROWS)
        prompt_rows = PROMPT_ROWS.set(any(s.kind == StepKind.PREFILL for s in order))
        int8_rows = INT8_ROWS.set(self.int8_activations)
        try:
            if self.lora is None:
                return self.model(input_ids, positions, self.kv_caches, md)
            self.lora.bind(order)
            try:
                return self.model(input_ids, positions, self.kv_caches, md)
            finally:  # another runner over the same model (calibration) must not see this batch's rows
                self.lora.unbind()
        finally:
            INT8_ROWS.reset(int8_rows)
            PROMPT_ROWS.reset(prompt_rows)

    def _prepare(self, order: list[ScheduledRequest], bm: BlockManager):
        if len(order) >= KEPT_TABLES_MIN_ROWS and not self.backend.reference and all(
                s.kind == StepKind.DECODE for s in order):
            return self._prepare_decodes(order, bm)
        return self._prepare_lists(order, bm)

    def _prepare_lists(self, order: list[ScheduledRequest], bm: BlockManager):
        """Any batch's inputs, built from lists (prefill chunks, verifies, the reference path)."""
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        seqs = []
        prefills: list[PrefillSeq] = []
        dec_tables, dec_lens = [], []
        tree_masks: dict[int, torch.Tensor] = {}
        triton = self.backend.triton is not None  # every prompt chunk reads its whole context from the cache
        chunk_tables: list[list[int]] = []  # the Triton prefill's chunks' tables (tree verifies excluded)
        for s in order:
            req = s.request
            start, end = req.num_computed_tokens, req.num_computed_tokens + s.num_tokens
            table = bm.block_table(req.request_id)
            q_start = len(ids)
            tree = None
            if s.kind == StepKind.VERIFY:  # the last known token, then the drafts being checked
                tokens = req.token_slice(start, req.num_tokens) + req.spec_token_ids[: end - req.num_tokens]
                if req.spec_tree:
                    tree = tree_layout(req.spec_tree[: s.num_tokens - 1], self.device)
            else:
                tokens = req.token_slice(start, end)
            ids.extend(tokens)
            # A tree's rows sit in consecutive slots, but each at the position of its depth.
            pos.extend(range(start, end) if tree is None else (start + d for d in tree[0]))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            seqs.append((q_start, s.num_tokens, end, table))
            if s.kind == StepKind.DECODE:
                dec_tables.append(table)
                dec_lens.append(end)
            else:
                ctx_blocks = None
                if start > 0 or triton:
                    ctx_blocks = self._to_device(table[: -(-end // bs)])
                prefills.append(PrefillSeq(q_start, s.num_tokens, end, ctx_blocks,
                                           None if tree is None else tree[1]))
                if tree is not None:
                    tree_masks[q_start] = tree[1]
                elif triton:
                    chunk_tables.append(table)
        groups = self._decode_groups(dec_lens, lambda a, b, width: self._block_rows(dec_tables[a:b], width)) \
            if dec_lens else []
        md = AttentionMetadata(
            slot_mapping=self._to_device(slots),
            num_decode_tokens=len(dec_tables),
            decode_groups=groups,
            prefills=prefills,
            seqs=seqs,
            block_size=bs,
            tree_masks=tree_masks,
            backend=self.backend,
            prefill_batch=self._prefill_batch(prefills, chunk_tables) if chunk_tables else None,
        )
        return self._to_device(ids), self._to_device(pos), md

    def _prefill_batch(self, prefills: list[PrefillSeq], tables: list[list[int]]) -> PrefillBatch:
        """The Triton prefill kernel's view of the step's prompt chunks (tree verifies take their own path)."""
        chunks = [p for p in prefills if p.tree_mask is None]
        width = max(-(-p.ctx_len // self.block_size) for p in chunks)
        return PrefillBatch(self._block_rows(tables, width).view(len(chunks), width),
                            self._to_device([p.q_start for p in chunks]), self._to_device([p.q_len for p in chunks]),
                            self._to_device([p.ctx_len for p in chunks]), max(p.q_len for p in chunks))

    def _prepare_decodes(self, order: list[ScheduledRequest], bm: BlockManager):
        """_prepare of an all-decode step, from the block tables kept across steps: no list of lists per
        step. md.seqs stays empty (only the reference path reads it)."""
        d = decode_inputs([s.request for s in order], self.block_tables, bm)
        groups = self._decode_groups(d.lens, lambda a, b, width: self._to_device(d.tables[a:b, :width].reshape(-1)))
        md = AttentionMetadata(slot_mapping=self._to_device(d.slots), num_decode_tokens=len(order),
                               decode_groups=groups, block_size=self.block_size, backend=self.backend)
        return self._to_device(d.ids), self._to_device(d.positions), md

    def _decode_groups(self, lens: list[int], block_rows: Callable[[int, int, int], torch.Tensor]) -> list[DecodeGroup]:
        """Decodes arrive sorted by context length; cut them where a group's longest context would
        exceed DECODE_GROUP_RATIO times its shortest, which bounds the padding gathered with the K/V.
        The native kernel and FlexAttention read each context to its own length: one group, no padding
        mask (the native kernel takes the lengths on the host, FlexAttention and the Triton kernel on the device).
        block_rows(start, end, width): rows start..end's block tables cut or padded to width, flattened."""
        bs, groups, start = self.block_size, [], 0
        flex = self.backend.flex is not None and self.backend.flex.fn is not None  # not disabled by a failure
        if self.backend.native_decode is not None or flex or self.backend.triton is not None:
            max_blocks = -(-lens[-1] // bs)
            ctx_lens = host_ints(lens) if self.backend.native_decode is not None else self._to_device(lens)
            return [DecodeGroup(0, len(lens), max_blocks * bs, block_rows(0, len(lens), max_blocks), None, ctx_lens)]
        while start < len(lens):
            end = start + 1
            while end < len(lens) and lens[end] <= DECODE_GROUP_RATIO * lens[start]:
                end += 1
            max_blocks = -(-lens[end - 1] // bs)
            max_ctx = max_blocks * bs  # whole blocks are gathered; the tail past each length is masked
            group_lens = host_ints(lens[start:end])
            if self._positions.shape[0] < max_ctx:  # 0, 1, 2, ... kept: one arange per longer context, not per step
                self._positions = torch.arange(2 * max_ctx)
            padding = self._positions[:max_ctx] >= group_lens.unsqueeze(1)
            mask = torch.where(padding, float("-inf"), 0.0).to(self.dtype)  # (n, max_ctx): 0 or -inf
            # the mask broadcasts over (kv_heads, n, group, max_ctx)
            groups.append(DecodeGroup(start, end - start, max_ctx, block_rows(start, end, max_blocks),
                                      self._to_device(mask)[:, None, :], group_lens))
            start = end
        return groups

    def _block_rows(self, tables: list[list[int]], max_blocks: int) -> torch.Tensor:
        """(len(tables) * max_blocks,) each table cut or padded with block 0 to max_blocks, flattened."""
        flat: list[int] = []
        for t in tables:
            row = t[:max_blocks]
            flat += row
            flat += [0] * (max_blocks - len(row))
        return self._to_device(flat)

    def _to_device(self, values) -> torch.Tensor:
        """A step input (a list of ints, or a host tensor) on the device. On CUDA through pinned host
        memory, so the copy is asynchronous: from pageable memory a non_blocking copy still waits."""
        host = values if isinstance(values, torch.Tensor) else host_ints(values)
        if self.device.type == "cpu":
            return host  # already there (a .to() would still cost a dispatch)
        if self.device.type != "cuda":
            return host.to(self.device)
        return host.pin_memory().to(self.device, non_blocking=True)

    def move_slots(self, moves: list[tuple[int, int]]) -> None:
        """Copy K/V from slot src to slot dst in every layer, in order (a tree's accepted path moving to
        the positions it now holds)."""
        if not moves:
            return
        src = torch.tensor([a for a, _ in moves], device=self.device)
        dst = torch.tensor([b for _, b in moves], device=self.device)
        for k, v in self.kv_caches:
            k.index_copy_(1, dst, k.index_select(1, src))
            v.index_copy_(1, dst, v.index_select(1, src))
