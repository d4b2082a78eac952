"""`inferlab bench host`: the engine's own work around one decode step, with the model made free.

The model's forward pass and its lm_head are replaced by a no-op (NoOpModel): the forward returns rows of a
preallocated zero hidden-state tensor, compute_logits rows of a preallocated float32 (rows, vocab) tensor,
zero but for one entry per row. Everything else of engine.step() runs as when serving: draining commands,
scheduling, block tables, the step's input tensors and attention metadata, sampling over the full logits,
the one read-back, appending tokens, detokenizing, the RequestOutputs and the step event. What is left is
the ceiling a step's host work puts on tokens/s when the forward itself is cheap (CUDA graphs).

Figures: µs a decode step at each stream count, greedy and sampled, medians of alternating rounds; and
where the time goes (one more pass with a CPU timer around each part of the step: schedule, inputs, the
no-op forward, sample + read-back, outputs, publish; and a cProfile pass: the functions with the most time of
their own, inflated by the profiler's own cost). On the CPU the
sampler's pass over the logits (each row's argmax and check; for a sampled row its softmax and draw) runs
inline and counts in the step; on a GPU it is device work, so each step is also given less the time its
sampler spent in the native pass (host_median: the GPU path's host work, measured in the same steps).
"""
from __future__ import annotations

import copy
import cProfile
import dataclasses
import os
import pstats
import statistics
import time

import torch

from app.bench.rounds import bench_engine
from app.load.workload import corpus_tokens
from engine import LLMEngine, SamplingParams
from engine.drive import drive

HOT_LOGIT = 10.0  # the one non-zero logit of each row: greedy picks it, sampling picks it ~1/3 of the time
# (e^10 against ~49,000 zeros); the other draws spread over the vocabulary and reach the detokenizer too
TARGETS_US = {1: 150.0, 64: 1000.0}  # issue 46: the host's work a decode step, at these stream counts
NOOP_REPLACED = ("the model's forward pass (embedding, every layer, final norm) and its lm_head: the forward returns "
                 "rows of a preallocated zero (tokens, hidden) tensor, compute_logits rows of a preallocated float32 "
                 f"(rows, vocab) tensor, zero but {HOT_LOGIT} at one token per row; sampling, the read-back, "
                 "detokenizing and the outputs run on them as when serving")
HOST_MEDIAN = ("the GPU path's host work: there the pass over the logits is the Triton sampling kernel's, device "
               "work; absent where the sampler runs on torch's ops (no native rows kernel)")
# top-p / top-k would add a sort of every row over the vocabulary (device work on a GPU)
SAMPLING = {"greedy": SamplingParams(temperature=0.0), "sampled": SamplingParams(temperature=0.8)}
# the parts of a step timed apart (owner's path from the engine, attribute, label); each is called once a step
SECTIONS = (("", "_step", "step (all of it)"), ("scheduler", "schedule", "schedule"),
            ("runner", "execute", "execute (runner)"), ("runner", "_prepare", "inputs (ids, positions, slots, tables)"),
            ("model", "forward", "forward (the no-op)"), ("runner_module", "read_back_step", "sample + read-back"),
            ("", "_update", "outputs (tokens, detokenize, RequestOutputs)"), ("", "_publish", "publish (stats, event)"))


def add_args(p, engine_args) -> None:
    engine_args(p)
    p.add_argument("--json", metavar="OUT", help="write the results here")
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 64], help="decoding streams (default 1 8 64)")
    p.add_argument("--sampling", nargs="+", choices=list(SAMPLING), default=list(SAMPLING),
                   help="greedy: temperature 0; sampled: temperature 0.8, a seed per request")
    p.add_argument("--steps", type=int, default=64, help="decode steps timed per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds alternating every configuration (medians)")
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--generated", type=int, default=0, metavar="N",
                   help="tokens each stream has generated before the timed steps (a long answer's per-step costs; "
                        "the KV cache is sized for them); default: the first few")
    p.add_argument("--no-profile", action="store_true", help="skip the breakdown passes (timed sections, cProfile)")


class NoOpModel:
    """Makes `engine`'s forward pass and lm_head free (instance attributes over the model's methods);
    the tensors returned are views of buffers made once, of the shapes the real ones have."""

    def __init__(self, engine: LLMEngine, max_rows: int, hot_token: int) -> None:
        mc, model = engine.model_config, engine.model
        self.hidden = torch.zeros(max_rows, mc.hidden_size, dtype=engine.dtype, device=engine.device)
        self.logits = torch.zeros(max_rows, mc.vocab_size, dtype=torch.float32, device=engine.device)
        self.logits[:, hot_token] = HOT_LOGIT
        model.forward = self.forward
        model.compute_logits = self.compute_logits

    def forward(self, input_ids: torch.Tensor, positions, kv_caches, md) -> torch.Tensor:
        return self.hidden[: input_ids.shape[0]]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits[: hidden.shape[0]]


def host_engine(args) -> LLMEngine:
    """The engine under test: layer by layer (the fused native step would bypass the no-op), no compile, no CUDA
    graphs (they would replay the model captured at build, not the no-op put in after)."""
    n = max(args.streams)
    tokens = n * (args.prompt_tokens + args.generated + (args.steps + 8) * 2)
    args = copy.copy(args)
    args.cuda_graphs = False
    engine = bench_engine(args, fused_decode=False, compile=False, max_num_seqs=n,
                          max_num_batched_tokens=max(512, n * args.prompt_tokens),
                          num_kv_blocks=-(-tokens // 16) + 2 * n)
    return engine


def _prompts(engine: LLMEngine, n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens from the corpus, each from its own offset (read round the corpus where it
    is short): no two share a first block, so none is a prefix-cache hit of another."""
    corpus = corpus_tokens(engine.tokenizer)
    return [[corpus[(i * 101 + j) % len(corpus)] for j in range(length)] for i in range(n)]


def _start(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, steps: int,
           generated: int = 0) -> list[str]:
    """Every prompt added and prefilled, every stream decoding with at least `generated` tokens out (and past
    its first decode steps: a fresh batch shape stays out); `steps` decode steps left to each. The prefix
    cache (on, as by default: each full block is hashed as it fills) is emptied first: no round starts warm."""
    engine.block_manager.reset_prefix_cache()
    ids = [engine.add_request(p, dataclasses.replace(params, max_tokens=generated + steps + 4, ignore_eos=True,
                                                     seed=i))
           for i, p in enumerate(prompts)]
    drive(engine, until=lambda: not (any(not r.output_token_ids for r in engine.scheduler.running)
                                      or engine.scheduler.waiting))
    drive(engine, until=lambda: False, max_steps=2)  # the first decode steps (a fresh batch shape) stay out
    drive(engine, until=lambda: all(r.num_output_tokens >= generated for r in engine.scheduler.running))
    return ids


def _finish(engine: LLMEngine, ids: list[str]) -> None:
    for i in ids:
        engine.abort(i)
    drive(engine)


class TimedRows:
    """The runner's native rows kernel (ModelRunner.rows_kernel: the sampler's one pass over each row of logits,
    engine/kernels/sample_rows.cpp) with a clock around each call: `spent` is the wall-clock seconds inside it.
    On a GPU this pass is device work (the Triton sampling kernel), so a step's host work on the GPU path is
    the step less this, measured in the same step."""

    def __init__(self, module) -> None:
        self.module, self.spent = module, 0.0

    def tier(self) -> str:
        return self.module.tier()

    def _timed(self, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.spent += time.perf_counter() - t

    def greedy_rows(self, logits):
        return self._timed(self.module.greedy_rows, logits)

    def sample_rows(self, logits, temperature, u):
        return self._timed(self.module.sample_rows, logits, temperature, u)


def timed_steps(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams,
                steps: int, generated: int = 0) -> tuple[list[float], list[float], list[float] | None]:
    """(wall-clock µs, this thread's CPU µs, wall-clock µs less the pass over the logits) of each of `steps`
    decode steps of len(prompts) streams. The CPU time leaves out the time other processes held the core (a
    shared machine's load). The third: each step less the time its sampler spent in the native pass over the
    logits (TimedRows), None where the runner has no native rows kernel (torch's ops scan the logits)."""
    ids = _start(engine, prompts, params, steps, generated)
    wall, cpu, host, started = [], [], [], []
    clock, cpu_clock = time.perf_counter, time.thread_time
    runner = engine.runner
    kernel = runner.rows_kernel
    rows = TimedRows(kernel) if kernel is not None else None

    def before() -> None:
        if rows is not None:
            rows.spent = 0.0
        started.append((clock(), cpu_clock()))

    def after(_outputs) -> None:
        t, c = started.pop()
        cpu.append((cpu_clock() - c) * 1e6)
        wall.append((clock() - t) * 1e6)
        if rows is not None:
            host.append(wall[-1] - rows.spent * 1e6)

    runner.rows_kernel = rows if rows is not None else kernel
    try:
        drive(engine, until=lambda: False, max_steps=steps, before_step=before, on_outputs=after)
    finally:
        runner.rows_kernel = kernel
    _finish(engine, ids)
    return wall, cpu, host if rows is not None else None


def _row(n: int, wall: list[float], cpu: list[float], host: list[float] | None = None) -> dict:
    """One configuration's figures from its rounds' medians."""
    med, cpu_med = statistics.median(wall), statistics.median(cpu)
    row = {"median": round(med, 1), "each_round": [round(r, 1) for r in wall], "cpu_median": round(cpu_med, 1),
           "cpu_each_round": [round(r, 1) for r in cpu], "tokens_per_s_ceiling": round(n * 1e6 / med, 1)}
    host_med = statistics.median(host) if host else None
    if host:
        row.update(host_median=round(host_med, 1), host_each_round=[round(r, 1) for r in host])
    if n in TARGETS_US:
        row.update(target=TARGETS_US[n], meets_target=med <= TARGETS_US[n], cpu_meets_target=cpu_med <= TARGETS_US[n])
        if host_med is not None:
            row["host_meets_target"] = host_med <= TARGETS_US[n]
    return row


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def timed_sections(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, steps: int,
                   generated: int = 0) -> dict:
    """The engine thread's CPU µs a step in each of SECTIONS (a timer around each, restored after): the mean
    over `steps` decode steps."""
    import engine.runner.model_runner as runner_module

    owners = {"": engine, "scheduler": engine.scheduler, "runner": engine.runner, "model": engine.model,
              "runner_module": runner_module}
    spent = {label: 0.0 for _, _, label in SECTIONS}
    patched = []

    def timed(fn, label):
        def wrapper(*args, **kwargs):
            t = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.thread_time() - t
        return wrapper

    ids = _start(engine, prompts, params, steps, generated)
    for owner, attr, label in SECTIONS:
        obj = owners[owner]
        if hasattr(obj, attr):  # (a part renamed since: left out, not mistimed)
            patched.append((obj, attr, obj.__dict__.get(attr)))
            setattr(obj, attr, timed(getattr(obj, attr), label))
    try:
        for label in spent:
            spent[label] = 0.0
        drive(engine, until=lambda: False, max_steps=steps)
    finally:
        for obj, attr, before in reversed(patched):
            if before is None:
                delattr(obj, attr)  # the class's method again
            else:
                setattr(obj, attr, before)
    _finish(engine, ids)
    return {label: round(s / steps * 1e6, 1) for label, s in spent.items()}


def profiled(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, steps: int,
             generated: int = 0) -> list[dict]:
    """cProfile over `steps` decode steps: the functions with the most time of their own (the profiler's cost
    inflates the Python-heavy ones)."""
    ids = _start(engine, prompts, params, steps, generated)
    prof = cProfile.Profile()
    prof.enable()
    drive(engine, until=lambda: False, max_steps=steps)
    prof.disable()
    _finish(engine, ids)
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, own s, cumulative s, callers)
    top = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:12]
    return [{"function": f"{os.path.basename(f)}:{line} {fn}", "own_us_per_step": round(v[2] / steps * 1e6, 1),
             "calls_per_step": round(v[0] / steps, 1)} for (f, line, fn), v in top]


def _decode_attention(backend) -> str:
    """Which decode attention the step's metadata is prepared for (each path has its own host work)."""
    if backend.native_decode is not None:
        return "native kernel (lengths and block rows, one group)"
    if backend.flex is not None and backend.flex.fn is not None:
        return "FlexAttention (lengths and block rows on the device, one group)"
    return "eager (groups of similar lengths, a padding mask each)"


def run(args) -> dict:
    if min(args.streams) < 1 or args.steps < 1 or args.rounds < 1 or args.generated < 0:
        raise ValueError("--streams, --steps and --rounds must be 1 or more, --generated 0 or more")
    engine = host_engine(args)
    if args.prompt_tokens + args.generated + args.steps + 4 > engine.max_model_len:
        raise ValueError(f"--prompt-tokens + --generated + --steps pass the model's {engine.max_model_len} tokens")
    streams = sorted(set(args.streams))
    prompts = _prompts(engine, max(streams), args.prompt_tokens)
    NoOpModel(engine, engine.config.max_num_batched_tokens, prompts[0][-1])
    configs = [(mode, n) for mode in args.sampling for n in streams]
    for mode, n in configs:  # warm-up: each shape once
        timed_steps(engine, prompts[:n], SAMPLING[mode], 4)
    wall: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    cpu: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    host: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    loads = [_load()]
    for _ in range(args.rounds):  # alternating: every configuration sees the same drift of a shared machine
        for mode, n in configs:
            w, c, h = timed_steps(engine, prompts[:n], SAMPLING[mode], args.steps, args.generated)
            wall[(mode, n)].append(statistics.median(w))
            cpu[(mode, n)].append(statistics.median(c))
            if h is not None:
                host[(mode, n)].append(statistics.median(h))
        loads.append(_load())
    out: dict = {"noop_replaced": NOOP_REPLACED, "engine": engine.compute_line(),
                 "vocab_size": engine.model_config.vocab_size, "attention_backend": engine.runner.backend.name,
                 "decode_attention": _decode_attention(engine.runner.backend),
                 "prompt_tokens": args.prompt_tokens, "generated_before_timing": args.generated,
                 "steps_per_round": args.steps, "rounds": args.rounds,
                 "load_average_each_round": loads, "sampling": {m: repr(SAMPLING[m]) for m in args.sampling},
                 "clocks": "median: wall-clock µs a step (what a client waits); cpu_median: the engine thread's CPU "
                           "µs a step (time.thread_time: without the time other processes held the core); "
                           "host_median: wall-clock µs a step less, in each step, the time the sampler spent in its "
                           f"native pass over the logits ({HOST_MEDIAN}); medians of each round's median",
                 "us_per_step": {mode: {str(n): _row(n, wall[(mode, n)], cpu[(mode, n)], host[(mode, n)])
                                        for n in streams} for mode in args.sampling}}
    if not args.no_profile:
        out["breakdown"] = {f"{mode} {n} streams": {
            "cpu_us_per_step": timed_sections(engine, prompts[:n], SAMPLING[mode], args.steps, args.generated),
            "most_own_time_under_cprofile": profiled(engine, prompts[:n], SAMPLING[mode], args.steps, args.generated)}
            for mode, n in configs}
    return out
