"""Decode steps replayed from CUDA graphs (EngineConfig.cuda_graphs; vLLM / nano-vllm style).

A decode step on a GPU is a few hundred small kernels whose launches cost more than their work for a
small model. A CUDA graph records them once and replays them with one launch, but only over fixed
shapes and fixed memory: so each graph belongs to a (batch bucket, context bucket) pair and reads its
inputs from static buffers that every step fills in place.

- Batch bucket: the decode rows padded up to the next of BATCH_BUCKETS; a padding row repeats row 0
  (the same token, position and slot: it writes the same K/V to the same slot, and its output is cut).
- Context bucket: the longest context padded to a power of two of blocks: the static block tables'
  width. A backend that reads each row's own pages in place (the Triton kernels, CUDA's default; or
  FlexAttention, its block mask rebuilt inside the graph from the static tables and lengths) reads only
  each row's context, whatever the width: every graph is captured at max_model_len's bucket at engine
  build and serves every context (no tensor of it is as wide as the cache: a graph's memory does not
  depend on the KV cache's size). On the eager decode attention every row gathers that many slots
  (whole-block gather + matmuls) under an additive mask built from the context lengths on the device,
  before the replay, so its graphs are captured per context bucket as steps need them.
- One copy in a step: the token ids, positions, slots, context lengths and block tables of a bucket are
  views of one device tensor, filled from one pinned host tensor by a few tensor copies (the tables from
  the rows the runner keeps across steps, engine/runner/input_batch.py: no list of lists a step).
- Only steps that are all decodes, with no LoRA rows (an engine with an adapter pool keeps its graphs
  for steps without adapters: unbound, the LoRA layers add nothing, so nothing of theirs is captured),
  not on the native kernel or the compiled decode attention, uncompiled. Anything else runs the
  ordinary path.

At engine build (`build_all`, vLLM style) every batch bucket up to max_num_seqs is captured at one
context bucket (above). Before the KV cache is sized, the same set is captured once on a throwaway runner
with a small cache and its memory measured (engine/runner/profile.py: profile_graph_bytes), so the KV
budget leaves room for it: the static buffers are sized by the buckets alone, so the real cache's capture
takes what the throwaway's did. Reading pages in place, nothing is ever captured while serving: a step
whose bucket was not built at start-up (max_num_seqs raised later) runs the ordinary path.

Graphs are dropped whenever what they captured changes: the KV tensors (resize, release), the weights
(requantization), the execution mode. Switched off (EngineConfig.cuda_graphs, between bench rounds) they
are kept, and switched on again they serve at once, with no new capture (ModelRunner.park_graphs). On the
CPU the flag runs the very same static buffers without capturing (what the tests check against the
ordinary path): capture, and a graph memory above 0 bytes, happen only on CUDA.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from engine.core.block_manager import BlockManager
from engine.core.scheduler import ScheduledRequest
from engine.events import StepKind
from engine.kernels.gpu.launches import on_host
from engine.models.layers.attention import AttentionMetadata, DecodeGroup
from engine.runner.input_batch import DecodeInputs, decode_inputs, host_ints

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def batch_bucket(n: int) -> int | None:
    return next((b for b in BATCH_BUCKETS if b >= n), None)


def context_bucket(num_blocks: int) -> int:
    """Blocks attended per row: the next power of two (few graphs, at most 2x the gather)."""
    return 1 << max(0, num_blocks - 1).bit_length()


def startup_batch_buckets(max_num_seqs: int) -> list[int]:
    """The batch buckets built at start-up: every one up to the bucket that holds max_num_seqs rows."""
    top = batch_bucket(max_num_seqs) or BATCH_BUCKETS[-1]
    return [b for b in BATCH_BUCKETS if b <= top]


def reads_pages_in_place(backend) -> bool:
    """The Triton kernels and FlexAttention read each row's own pages (a wider block table costs little); the
    eager decode attention gathers the whole bucket's width per row."""
    return backend.triton is not None or (backend.flex is not None and backend.flex.fn is not None)


def startup_context_bucket(backend, max_model_len: int, block_size: int) -> int:
    """Reading pages in place: the bucket of max_model_len (FlexAttention's block mask is as wide as the
    table, whatever the cache's size). Gathering: 1."""
    if not reads_pages_in_place(backend):
        return 1
    return context_bucket(-(-max_model_len // block_size))


class ReservedMeter:
    """Bytes torch's caching allocator holds on a GPU (a graph's private pool included); 0 on the CPU,
    where nothing is captured."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reserved(self) -> int:
        if self.device.type != "cuda":
            return 0
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.memory_reserved(self.device))


@dataclass(slots=True)
class StaticStep:
    inputs: torch.Tensor  # (4B + B * C,) int64 on the device: ids, positions, slots, context lengths, tables
    host: torch.Tensor  # the same on the host (pinned on CUDA): written each step, copied in one go
    ids: torch.Tensor  # (B,) views of `inputs`
    positions: torch.Tensor  # (B,)
    slots: torch.Tensor  # (B,)
    ctx_lens: torch.Tensor  # (B,)
    blocks: torch.Tensor  # (B * C,)
    mask: torch.Tensor | None  # (B, 1, C * block_size) additive: the eager decode attention's (None in place)
    md: AttentionMetadata
    out: torch.Tensor | None = None  # (B, hidden) what the graph writes
    graph: object = None  # torch.cuda.CUDAGraph once captured


class DecodeGraphs:
    """Held by the ModelRunner it serves, which passes itself to each call (no reference back to it:
    a dropped engine frees at once)."""

    def __init__(self, capture: bool) -> None:
        self.capture = capture
        self._steps: dict[tuple[int, int], StaticStep] = {}
        self._pool = None
        self.num_runs = 0  # steps through the static buffers (replayed or, on the CPU, run eagerly)
        self.num_replays = 0
        self.num_captures = 0
        self.capture_error: str | None = None  # why capture was turned off, if it was
        # what the captured graphs hold on the device (torch's reserved bytes across each capture): 0 on the CPU
        self.pool_bytes = 0
        self.startup_buckets: list[tuple[int, int]] = []  # (batch, context) built by build_all

    def invalidate(self) -> None:
        self._steps.clear()
        self._pool = None
        self.pool_bytes = 0

    def build_all(self, runner, max_num_seqs: int, max_model_len: int, progress=None) -> int:
        """Build (on CUDA: capture) every start-up bucket (see the module docstring) before any step;
        returns the bytes the captures took (0 on the CPU). Does nothing on a backend graphs never run
        (native kernel, compiled decode, reference, compiled model). The capture's warm-up writes K/V
        at slot 0: the caches are zeroed again after it."""
        if not self.backend_eligible(runner):
            return 0
        meter = ReservedMeter(runner.device)
        before = meter.reserved()
        c = startup_context_bucket(runner.backend, max_model_len, runner.block_size)
        buckets = startup_batch_buckets(max_num_seqs)
        verb = "capturing" if self.capture else "building (the CPU: no capture)"
        for i, b in enumerate(buckets):
            if progress is not None:
                progress(f"{verb} decode graphs {i + 1}/{len(buckets)}", (i + 1) / len(buckets))
            st = self._steps.get((b, c)) or self._new_step(runner, b, c)
            st.ctx_lens.fill_(1)  # one valid slot per row: the capture's attention stays finite
            if st.mask is not None:
                st.mask.fill_(float("-inf"))
                st.mask[..., 0] = 0.0
            if self.capture and st.graph is None:
                self._capture(runner, st)
        if self.capture:
            for k, v in runner.kv_caches:
                k.zero_()
                v.zero_()
        self.startup_buckets = [(b, c) for b in buckets]
        taken = max(0, meter.reserved() - before)
        self.pool_bytes += taken
        return taken

    def built_buckets(self) -> list[tuple[int, int]]:
        """(batch, context) of every bucket whose static step exists, in the order they were built."""
        return list(self._steps)

    def backend_eligible(self, r) -> bool:
        backend = r.backend
        return (not backend.reference and backend.native_decode is None
                and backend.compiled_decode is None and not r.model.compiled)

    def eligible(self, r, order: list[ScheduledRequest]) -> bool:
        b = batch_bucket(len(order))
        return (bool(order) and all(s.kind == StepKind.DECODE for s in order) and b is not None
                and (r.lora is None or all(s.request.lora_id == 0 for s in order))  # an idle pool adds nothing
                and self.backend_eligible(r)
                # reading pages in place on CUDA: only what start-up captured (nothing captured while serving)
                and (not self.capture or not reads_pages_in_place(r.backend)
                     or any(bb == b for bb, _ in self._steps)))

    def run(self, runner, order: list[ScheduledRequest], bm: BlockManager) -> torch.Tensor:
        """Final hidden states (len(order), hidden) of an all-decode batch, through its bucket's graph."""
        bs = runner.block_size
        n = len(order)
        with on_host():  # host tensors: no launch on a GPU
            d = decode_inputs([s.request for s in order], runner.block_tables, bm)  # from tables kept across steps
        b = batch_bucket(n)
        c = self._context_for(runner, b, context_bucket(-(-max(d.lens) // bs)))
        st = self._steps.get((b, c)) or self._new_step(runner, b, c)
        self.num_runs += 1
        with on_host():
            _fill_inputs(st, d, n, b, c)
        st.inputs.copy_(st.host, non_blocking=True)  # the step's one copy in
        if st.mask is not None:  # the gathering attention's mask, from the lengths, on the device
            valid = torch.arange(c * bs, device=st.inputs.device).unsqueeze(0) < st.ctx_lens.unsqueeze(1)
            st.mask.copy_(torch.zeros_like(valid, dtype=st.mask.dtype).masked_fill_(~valid, float("-inf")).unsqueeze(1))
        if st.graph is not None:
            st.graph.replay()
            self.num_replays += 1
        elif self.capture and self._capture_measured(runner, st):
            st.graph.replay()  # capturing records the kernels without running them
        else:
            st.md.decode_groups[0].flex_mask = None  # uncaptured: the block mask is built anew each step
            st.out = _forward(runner, st)
        return st.out[:n].clone()  # graphs share a memory pool: the next replay may reuse this buffer

    def _context_for(self, runner, b: int, c: int) -> int:
        """The context bucket a step of batch bucket b runs in: reading pages in place, the smallest
        built one that holds c (a start-up graph, no new capture); gathering, c itself."""
        if reads_pages_in_place(runner.backend):
            built = [cc for bb, cc in self._steps if bb == b and cc >= c]
            return min(built) if built else c
        return c

    def _capture_measured(self, runner, st: StaticStep) -> bool:
        meter = ReservedMeter(st.ids.device)
        before = meter.reserved()
        captured = self._capture(runner, st)
        self.pool_bytes += max(0, meter.reserved() - before)
        return captured

    def _new_step(self, r, b: int, c: int) -> StaticStep:
        dev, bs = r.device, r.block_size
        inputs = torch.zeros(4 * b + b * c, dtype=torch.int64, device=dev)
        host = torch.zeros(inputs.shape, dtype=torch.int64, pin_memory=dev.type == "cuda")
        ids, positions, slots, ctx_lens, blocks = inputs.split([b, b, b, b, b * c])
        mask = None if r.backend.triton is not None else torch.zeros(b, 1, c * bs, dtype=r.dtype, device=dev)
        md = AttentionMetadata(slot_mapping=slots, num_decode_tokens=b,
                               decode_groups=[DecodeGroup(0, b, c * bs, blocks, mask, ctx_lens)],
                               prefills=[], seqs=[], block_size=bs, backend=r.backend)
        st = StaticStep(inputs, host, ids, positions, slots, ctx_lens, blocks, mask, md)
        self._steps[(b, c)] = st
        return st

    def _capture(self, runner, st: StaticStep) -> bool:
        """Warm up on a side stream (the allocator and lazy inits settle), then record one step. The
        warm-up and the capture write this step's K/V (the same values the replay writes). A step that
        cannot be captured (an op that waits for the host, say) turns capture off with one warning and
        the reason in capture_error: the static buffers then run uncaptured, the tokens unchanged."""
        side = torch.cuda.Stream(device=st.ids.device)
        side.wait_stream(torch.cuda.current_stream(st.ids.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                st.md.decode_groups[0].flex_mask = None
                _forward(runner, st)
        torch.cuda.current_stream(st.ids.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        st.md.decode_groups[0].flex_mask = None  # built inside the graph: every replay rebuilds it
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                st.out = _forward(runner, st)
        except RuntimeError as exc:
            self.capture, self.capture_error = False, f"{type(exc).__name__}: {exc}"
            warnings.warn(f"CUDA graph capture failed, decode steps run uncaptured: {exc}", stacklevel=2)
            return False
        self._pool = graph.pool()
        st.graph = graph
        self.num_captures += 1
        return True


def _forward(runner, st: StaticStep) -> torch.Tensor:
    return runner.model(st.ids, st.positions, runner.kv_caches, st.md)


def _fill_inputs(st: StaticStep, d: DecodeInputs, n: int, b: int, c: int) -> None:
    """The step's inputs into the bucket's host tensor: a few tensor copies, whatever the batch (the block
    tables come from the rows kept across steps, engine/runner/input_batch.py). Padding rows repeat row 0
    (the same token, position, slot, context and table): they compute row 0's values, so the K/V they write
    into row 0's slot are row 0's own, and their outputs are cut."""
    host = st.host
    for k, values in enumerate((d.ids, d.positions, d.slots, host_ints(d.lens))):
        host[k * b : k * b + n] = values
        host[k * b + n : (k + 1) * b] = values[0]
    rows = host[4 * b :].view(b, c)
    width = min(c, d.tables.shape[1])
    rows[:n, :width] = d.tables[:, :width]  # past a row's own blocks: zeros (block 0), never read unmasked
    if n < b:
        rows[n:] = rows[0]
