"""LLMEngine: add_request / abort / reconfigure from any thread; step() in one.

One step, top to bottom: drain the commands other threads queued -> fit the KV cache to the weights ->
propose drafts -> schedule -> run the model -> update the requests -> publish one event. The engine
composes parts, each with its own constructor and no access to another's fields: the scheduler and
block manager (counts), the model runner (tensors, KV cache, attention backend), the weights manager
(requantization, KV size), the speculative decoder, request intake and admission control.
"""
from __future__ import annotations

import dataclasses
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence

import torch

import engine.commands as cmd
import engine.kernels as kernels
from engine.config import SCHEDULER_FIELDS, EngineConfig
from engine.core.admission import AdmissionController
from engine.core.block_manager import BlockManager
from engine.core.counters import EngineCounters
from engine.core.intake import RequestIntake
from engine.core.output_processor import append_token, make_output, timeline
from engine.core.policies import make_policy
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.events import (
    BlockMapSnapshot,
    EngineStepEvent,
    KernelBuild,
    LoraAdapterInfo,
    MemorySnapshot,
    RequestOutput,
    SpecMethod,
)
from engine.kernels.tier_choice import family_for_format
from engine.knobs import RECONFIGURABLE
from engine.loading.errors import ModelLoadError
from engine.loading.loader import LoadedModel, load_model
from engine.lora.build import build_pool, require_pool, reserved_bytes
from engine.models.build import build_model
from engine.perf.step_counter import StepCounter
from engine.quant.at_load import quantizer_for
from engine.quant.manager import WeightsManager
from engine.quant.quality import activation_absmax, heldout_texts, perplexity
from engine.quant.schemes import prompt_rows_in_words
from engine.quant_formats import quant_format
from engine.queries import (
    EngineStats,
    engine_stats,
    fresh_hidden_states,
    fresh_hidden_states_many,
    generate,
    step_stats,
)
from engine.runner.cpu_compute import compute_line, plan_compute
from engine.runner.graphs import DecodeGraphs
from engine.runner.huge_pages import ArenaPlan
from engine.runner.memory import DeviceMemory, snapshot, weights_bytes
from engine.runner.model_runner import ModelRunner, StepResult
from engine.runner.profile import profile_graph_bytes, profile_peak_bytes
from engine.runner.setup import kv_block_bytes, resolve_device, stream_kernel_for
from engine.runner.threads import ThreadGovernor, choose_threads
from engine.sampling_params import SamplingParams
from engine.spec.decoder import SpeculativeDecoder
from engine.spec.draft import build_draft_model
from engine.validation import check_reconfigure, check_request

StepListener = Callable[[EngineStepEvent], None]
Progress = Callable[[str, float], None]
Outputs = dict[str, RequestOutput]


def _calibrator(engine_ref: weakref.ref) -> Callable[[], dict]:
    """The weights manager's calibration, holding the engine weakly: no part keeps its owner alive
    through a cycle, so a dropped engine frees its weights and KV cache at once, not at the next
    garbage collection (a rebuild on a GPU needs that memory for the new engine)."""
    return lambda: activation_absmax(engine_ref(), heldout_texts())


class LLMEngine:
    RECONFIGURABLE = RECONFIGURABLE

    def __init__(self, config: EngineConfig | None = None, *, loaded: LoadedModel | None = None,
                 progress: Progress | None = None) -> None:
        self.config = config = config or EngineConfig()  # replaced (never mutated) by reconfigure
        self.device = resolve_device(config.device)
        # on the CPU the thread count follows the free cores while the engine runs (engine/runner/threads.py)
        self.thread_governor = ThreadGovernor(config.num_threads) if self.device.type == "cpu" else None
        self.threads = self.thread_governor.choice if self.thread_governor else choose_threads(config.num_threads,
                                                                                              busy=None)
        if config.num_threads or self.device.type == "cpu":
            torch.set_num_threads(self.threads.count)
        self.compute = plan_compute(config.dtype, self.device)  # the dtype, what prefill computes in, and why
        # one bar for the whole start: loading fills 90 %, building the engine (and the kernel) the rest
        loaded = loaded or load_model(config.model, progress=progress and (lambda m, f: progress(m, 0.9 * f)))
        stream_kernel = stream_kernel_for(config, self.device, self.compute.dtype, progress)
        if stream_kernel is None and self.device.type == "cpu":
            self.compute = self.compute.without_native_kernels()
        self.dtype = self.compute.dtype
        wide = self.compute.matmul_dtype if self.compute.widened else None
        self.weights_origin = loaded.origin  # where the weights came from, for the quality figures
        self.tokenizer, self.model_path, self.model_config = loaded.tokenizer, loaded.path, loaded.config
        mc = self.model_config
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.block_bytes = kv_block_bytes(mc, config.block_size, self.dtype, config.kv_cache_dtype)
        torch.manual_seed(config.seed)
        try:
            at_load = quantizer_for(config, self.device)  # a GPU quantizes each layer as it loads
            # on the CPU the large weights are filled straight into one huge-page arena (one copy, not two)
            arena = ArenaPlan(self.dtype) if self.device.type == "cpu" else None
            self.model = build_model(mc, loaded.state_dict, self.device, self.dtype, on_layer=at_load, allocate=arena)
        except (KeyError, ValueError) as e:  # a tensor with no place, one missing, one of the wrong shape;
            # a config the model cannot be built from (an unsupported rope scaling)
            raise ModelLoadError(f"{loaded.path}: cannot build the model from its config.json and weights: "
                                 f"{e}") from e
        # a draft model is built before the KV cache is sized: its weights and its KV blocks (as many as
        # the target's) come out of the same budget
        draft = build_draft_model(config, loaded, mc, self.device, self.dtype, wide) \
            if config.spec_method == SpecMethod.DRAFT else None
        draft_block_bytes = draft.block_bytes(config.block_size, self.dtype) if draft else 0
        self.weights = WeightsManager(self.model, config, self.device, self.block_bytes + draft_block_bytes,
                                      calibrate=_calibrator(weakref.ref(self)),
                                      reserved_bytes=reserved_bytes(config, mc, self.device, self.dtype),
                                      profile_peak=lambda: profile_peak_bytes(self.model, mc, config, self.device,
                                                                              self.dtype),
                                      other_weights_bytes=weights_bytes(draft.model) if draft else 0,
                                      at_load=at_load, on_huge_pages=bool(arena and arena.placed),
                                      stream_kernel=stream_kernel, matmul_dtype=wide,
                                      profile_graphs=(lambda: profile_graph_bytes(self.model, mc, config, self.device,
                                                                                  self.dtype))
                                      if self.graphs_wanted(config) else None)
        del at_load
        # after the weights manager kept the 16-bit originals: the LoRA wrappers go around the projections
        self.lora = build_pool(self.model, mc, config, self.device, self.dtype)
        blocks = self.weights.kv_target
        self.max_model_len = min(config.max_model_len or mc.max_position_embeddings,
                                 mc.max_position_embeddings, blocks * config.block_size)
        self.block_manager = BlockManager(blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config.scheduler, self.block_manager)
        self.runner = ModelRunner(self.model, mc, blocks, config.block_size, self.device, self.dtype,
                                  kv_cache_dtype=config.kv_cache_dtype, matmul_dtype=wide)
        self.runner.kernel_family = family_for_format(config.quant_format)
        self.runner.set_execution(config.attention_backend, config.compile, progress, config.fused_decode,
                                  config.int8_activations, wait_kernels=config.kernel_build == KernelBuild.WAIT,
                                  batch_invariant=config.batch_invariant)
        # kernel_build "background": torch's kernels run until the native build is done (attach_built_kernels)
        self._kernels_pending = self.device.type == "cpu" and kernels.build_pending()
        self.runner.lora = self.lora
        self._use_graphs(self.graphs_wanted(config), startup=True, progress=progress)
        self.intake = RequestIntake(self.tokenizer, mc.vocab_size, self.max_model_len, config.seed)
        self.counters = EngineCounters()
        self.spec = SpeculativeDecoder(config, loaded, self.model, mc, self.runner, self.block_manager,
                                       self.eos_token_ids, self.max_model_len, draft)
        del draft
        self.admission = AdmissionController(config)
        self.commands = cmd.CommandQueue()  # the one queue: replaced by a loop's (attach_queue)
        self._requests: dict[str, Request] = {}  # drained and not finished, by id
        self._listeners: tuple[StepListener, ...] = ()  # copy-on-write: a step reads it while others subscribe
        self._listeners_lock = threading.Lock()
        # one step at a time, whoever calls it (an engine loop, generate() from several threads, score())
        self._step_lock = threading.RLock()
        self._last_activation_bytes = 0
        self._device_memory: DeviceMemory | None = None
        self._released: tuple | None = None  # release_memory: what restore_memory gives back
        self._cost = StepCounter(mc, torch.empty((), dtype=self.dtype).element_size())  # FLOPs/bytes per step
        if self.thread_governor is not None:  # the load took a window: the first count is a measured one
            self._follow_threads()
        if progress is not None:
            progress("engine ready", 1.0)

    # ---- commands (any thread): each is checked here, then queued; the engine thread applies it ----------
    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, priority: int = 0, lora_name: str | None = None,
                    chat: bool = False) -> str:
        """Check and queue a request (thread-safe, cheap: the prompt is tokenized in the engine thread).
        Raises ValueError for a bad request (engine.validation.validate_request; an unknown LoRA adapter)
        and RequestRejected (engine.core.admission) when admission control refuses it (config.max_queue_len,
        config.max_predicted_wait_s). A text prompt too long once tokenized finishes with finish_reason
        "error" and the reason. `lora_name`: an adapter added with add_lora (None: the base model). `chat`:
        a text prompt is a user message, rendered through the model's chat template when it has one."""
        params = params or SamplingParams()
        check_request(prompt, params, self.intake.limits)
        if not isinstance(prompt, str):
            prompt = tuple(int(t) for t in prompt)
        with self.commands.lock:
            # resolved under the queue's lock: a remove_lora queues its RemoveLora after this request, never
            # between the name's resolution and the put, so a queued request always finds its adapter
            lora_id = require_pool(self.lora).resolve(lora_name) if lora_name is not None else 0
            rid = request_id if request_id is not None else self.intake.next_id()
            pending = self.commands.pending(cmd.AddRequest)
            if rid in self._requests or any(c.request_id == rid for c in pending):
                raise ValueError(f"request id {rid!r} is already in use")
            # the queue after the last step (len() of the live deque is safe from any thread) + not drained
            self.admission.check(self.admission.queue(len(self.scheduler.waiting),
                                                      [c.num_prompt_tokens or 0 for c in pending]))
            self.commands.put_locked(cmd.AddRequest(rid, prompt, params, priority, lora_name, lora_id, chat))
        return rid

    def abort(self, request_id: str) -> None:
        self.commands.put(cmd.AbortRequest(request_id))

    def reconfigure(self, **changes) -> None:
        """Change scheduling knobs between steps (thread-safe; applied at the top of the next step).
        Raises ValueError for a knob that cannot change at run time or a bad value
        (engine.validation.check_reconfigure)."""
        self.commands.put(cmd.Reconfigure(check_reconfigure(self.config, changes)))

    def attach_queue(self, commands: cmd.CommandQueue) -> None:
        """Take commands from `commands` (an EngineLoop's, which runs this engine) from now on; what was
        queued here moves over, in its order. Call before other threads use the engine."""
        if commands is self.commands:
            return
        moved, self.commands = self.commands.take(cmd.ENGINE_COMMANDS), commands
        for command in moved:
            commands.put(command)

    def detach_queue(self) -> None:
        """A queue of its own again (the loop that ran it moved on to a rebuilt engine)."""
        self.commands = cmd.CommandQueue()

    def set_quantization(self, fmt: str, group_size: int | None = None, outlier_channels: int | None = None,
                         progress: Progress | None = None, embeddings: bool | None = None) -> dict[str, float]:
        """Requantize from the original weights (slow: in the caller's thread) and swap the new layers in
        at the top of the next step; queued and running requests carry on. Returns the per-layer
        relative weight error."""
        command, report = self.weights.prepare_swap(self.config, fmt, group_size, outlier_channels, progress,
                                                    embeddings)
        self.commands.put(command)
        return report

    # ---- LoRA adapters (any thread) --------------------------------------------------------------
    def add_lora(self, name: str, path: str) -> LoraAdapterInfo:
        """Read and check a PEFT adapter folder (in the caller's thread); requests may name it at once.
        Raises ValueError when the engine has no LoRA pool, the name is taken, or the adapter does not
        fit this base model (engine.lora.adapter.LoraLoadError, one message with every reason)."""
        adapter = require_pool(self.lora).register(name, str(path))
        self.commands.put(cmd.AddLora(adapter))
        return next(i for i in self.lora.infos() if i.lora_id == adapter.lora_id)

    def remove_lora(self, name: str) -> None:
        """New requests can no longer name it; requests already queued or running finish with it."""
        self.commands.put(cmd.RemoveLora(require_pool(self.lora).unregister(name), name))

    def list_loras(self) -> tuple[LoraAdapterInfo, ...]:
        return self.lora.infos() if self.lora is not None else ()

    def has_unfinished(self) -> bool:
        return self.commands.has(cmd.ENGINE_COMMANDS) or self.scheduler.has_unfinished()

    def add_listener(self, listener: StepListener) -> None:
        with self._listeners_lock:
            self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: StepListener) -> None:
        with self._listeners_lock:
            i = self._listeners.index(listener)  # ValueError when it is not there, as list.remove
            self._listeners = self._listeners[:i] + self._listeners[i + 1:]

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step (thread-safe: callers in several threads take turns; each step's outputs reach every
        listener, whoever called it)."""
        with self._step_lock:
            return self._step()

    def _step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        outputs: Outputs = {}
        finished: list[Request] = []
        arrived = self._drain_commands(outputs, finished)
        if self._kernels_pending:
            self._attach_built_kernels()
        if self.thread_governor is not None:
            self._follow_threads()
        self.weights.fit_kv(self.block_manager, self.runner)
        self.spec.begin_step()
        t_propose = time.perf_counter()
        self.spec.propose(self.scheduler.running)
        sched = self.scheduler.schedule()
        self._cost.begin(sched)  # the shapes, before the step moves num_computed_tokens
        if sched.is_empty and not outputs and not arrived:
            return []
        for req in sched.preempted:
            req.status = RequestStatus.PREEMPTED
        if self.lora is not None and not sched.is_empty:
            self._prepare_loras(sched, outputs, finished)
        if not sched.is_empty:
            t_run = time.perf_counter()
            self._run(sched, outputs, finished)
            t_done = time.perf_counter()
            prefill, decode, verify = sched.token_counts()
            self.scheduler.observe(prefill, prefill + decode + verify, t_done - t_run)
            if prefill == 0:  # what a decode or verify step of this many rows costs here
                self.spec.observe_step(len(sched.scheduled), decode + verify, t_done - t_propose)
        self.counters.steps += 1
        self._publish(t0, sched, outputs, finished, arrived)
        return list(outputs.values())

    def _follow_threads(self) -> None:
        """The thread count the governor says now, in the thread that steps (torch's count is per OS thread):
        another process that takes or frees a core changes it between two steps."""
        if self.thread_governor.poll():
            before, self.threads = self.threads.count, self.thread_governor.choice
            if self.threads.count != before:  # steps at the old count say little about the new one
                self.scheduler.forget_step_times()
        if torch.get_num_threads() != self.threads.count:
            torch.set_num_threads(self.threads.count)

    def kernels_line(self) -> str:
        """The native CPU kernels in words for the engine line: their ISA tier, a build in progress, or
        why they are not there ("torch's kernels" on a GPU, where they do not apply)."""
        if self.device.type != "cpu":
            return "none on this device (torch's kernels)"
        return (kernels.status(family=family_for_format(self.config.quant_format))
                + (", weights on huge pages" if self.weights.on_huge_pages else ""))

    def _attach_built_kernels(self) -> None:
        """kernel_build "background": once the native kernels' build is done, the weight-streaming products,
        the native attention and the fused step take over between two steps (a failed build leaves
        torch's kernels, as at start-up)."""
        if kernels.build_pending():
            return
        self._kernels_pending = False
        cfg = self.config
        self.weights.set_stream_kernel(stream_kernel_for(cfg, self.device, self.dtype))
        self.runner.set_execution(cfg.attention_backend, bool(cfg.compile), fused_decode=cfg.fused_decode,
                                  int8_activations=cfg.int8_activations, wait_kernels=False,
                                  batch_invariant=cfg.batch_invariant)

    def _drain_commands(self, outputs: Outputs, finished: list[Request]) -> list:
        """Apply every queued engine command; one that fails is reported (a warning; a request that cannot
        be added finishes with an error) and the others still apply."""
        arrived: list = []
        for command in self.commands.take(cmd.ENGINE_COMMANDS):
            try:
                self._apply(command, outputs, finished, arrived)
            except Exception as exc:  # noqa: BLE001 (any failure: report it, keep the rest of the batch)
                warnings.warn(f"engine command {type(command).__name__} failed: {type(exc).__name__}: {exc}",
                              RuntimeWarning, stacklevel=2)
        return arrived

    def _apply(self, command: cmd.EngineCommand, outputs: Outputs, finished: list[Request], arrived: list) -> None:
        match command:
            case cmd.AddRequest():
                self._take_request(command, outputs, finished, arrived)
            case cmd.AbortRequest(request_id=rid):
                req = self._requests.get(rid)
                if req is not None and not req.is_finished:
                    self._close(req, RequestStatus.FINISHED_ABORTED, outputs, finished)
            case cmd.Reconfigure(changes=changes):
                self._reconfigure_now(changes)
            case cmd.AddLora(adapter=adapter):
                self.lora.apply_add(adapter)
            case cmd.RemoveLora(lora_id=lora_id, name=name):
                self.lora.apply_remove(lora_id, name)
            case cmd.SwapWeights(settings=settings):
                self.weights.apply_swap(command, self.config)
                self.runner.invalidate_graphs()  # they captured the old layers
                self.config = dataclasses.replace(self.config, **settings)
                # the tier the next set_execution picks (the fused step keeps its build until then)
                self.runner.kernel_family = family_for_format(self.config.quant_format)

    def _take_request(self, command: cmd.AddRequest, outputs: Outputs, finished: list[Request], arrived: list) -> None:
        """Build the request (its prompt tokenized here, in the engine thread) and hand it to the scheduler.
        One that cannot be built (too long once tokenized) or whose adapter is gone finishes alone, with an
        error output that says why."""
        try:
            req = self.intake.build(command)
            if req.lora_id and not self.lora.is_known(req.lora_id):  # its adapter is gone: never in a batch
                raise ValueError(f"LoRA adapter {req.lora_name!r} was removed before the request started")
        except Exception as exc:  # noqa: BLE001 (this request's own failure: the others go on)
            self._fail(self.intake.failed_request(command), f"{type(exc).__name__}: {exc}", outputs, finished)
            return
        req.generator = torch.Generator(device=self.device).manual_seed(req.seed)
        self._requests[req.request_id] = req
        self.scheduler.add(req)
        self.counters.requests += 1
        arrived.append((req.request_id, req.arrival_time, req.num_prompt_tokens))

    def _reconfigure_now(self, changes) -> None:
        """A new config object (readers of engine.config see the old or the new one, never a mix); each
        part gets its own copy of the knobs it uses."""
        old = self.config
        # the scheduler's fields go into a new SchedulerConfig: through EngineConfig's constructor a None reads
        # "keep", and None is a value here (a max_step_ms or a latency budget switched off)
        sched = {k: v for k, v in changes.items() if k in SCHEDULER_FIELDS}
        rest = {k: v for k, v in changes.items() if k not in SCHEDULER_FIELDS}
        new = dataclasses.replace(old, **rest)
        new.scheduler = dataclasses.replace(old.scheduler, **sched)  # values checked by check_reconfigure
        self.config = new
        try:
            self._apply_knobs(old, new, changes)
        except Exception:  # the engine keeps serving with the knobs it had (the failure is reported)
            self.config = old
            self._apply_knobs(new, old, changes)
            raise

    def _apply_knobs(self, old: EngineConfig, cfg: EngineConfig, changes) -> None:
        self.scheduler.reconfigure(cfg.scheduler, make_policy(cfg.policy) if "policy" in changes else None)
        self.admission.set_limits(cfg.max_queue_len, cfg.max_predicted_wait_s)
        self.spec.set_num_tokens(cfg.num_speculative_tokens)
        if "spec_method" in changes:
            self.spec.switch(cfg.spec_method, self.scheduler.running)
        if (("compile" in changes and bool(cfg.compile) != self.model.compiled)
                or (old.fused_decode, old.int8_activations, old.batch_invariant)
                != (cfg.fused_decode, cfg.int8_activations, cfg.batch_invariant)):
            self.runner.set_execution(cfg.attention_backend, bool(cfg.compile), fused_decode=cfg.fused_decode,
                                      int8_activations=cfg.int8_activations, batch_invariant=cfg.batch_invariant)
        self._use_graphs(self.graphs_wanted(cfg))

    def graphs_wanted(self, config: EngineConfig) -> bool:
        """EngineConfig.cuda_graphs, with None (the default) read as: on where the engine runs on CUDA."""
        return self.device.type == "cuda" if config.cuda_graphs is None else bool(config.cuda_graphs)

    def _use_graphs(self, enabled: bool, startup: bool = False, progress: Progress | None = None) -> None:
        """EngineConfig.cuda_graphs: all-decode steps through static buffers, captured and replayed on CUDA.
        Every batch bucket is captured at once (engine/runner/graphs.py) when they are first switched on: at
        start-up, inside the memory the KV cache left for them, or between two steps (outside it: the cache
        was sized without them). Switched off, they are kept, and switched on again they serve as captured."""
        if enabled == (self.runner.graphs is not None):
            return
        if self.runner.park_graphs(enabled) is None and enabled:
            self.runner.graphs = DecodeGraphs(capture=self.device.type == "cuda")
            self.runner.graphs.build_all(self.runner, self.config.max_num_seqs, self.max_model_len,
                                         progress if startup else None)

    def _prepare_loras(self, sched: SchedulerOutput, outputs: Outputs, finished: list[Request]) -> None:
        """Every adapter of the batch into a device slot; requests whose adapter cannot load fail alone."""
        failed = self.lora.prepare_batch(sched.scheduled, self.scheduler.running, self._requests.values())
        for s in [s for s in sched.scheduled if s.request.lora_id in failed]:
            self._close(s.request, RequestStatus.FINISHED_ERROR, outputs, finished, failed[s.request.lora_id])
        sched.scheduled = [s for s in sched.scheduled if s.request.lora_id not in failed]

    def _run(self, sched: SchedulerOutput, outputs: Outputs, finished: list[Request]) -> None:
        """Run the batch; when the forward pass raises, run each request on its own so that only the
        ones that fail alone finish with an error (the others get their tokens this step)."""
        try:
            result = self.runner.execute(sched, self.block_manager)
        except Exception:  # noqa: BLE001 (which row is to blame is found by running them one by one)
            for s in sched.scheduled:
                # block copies are idempotent (src -> dst again), so each single run may repeat them
                single = SchedulerOutput(scheduled=[s], block_copies=sched.block_copies)
                try:
                    result = self.runner.execute(single, self.block_manager)
                except Exception as exc:  # noqa: BLE001 (this request's own failure: it ends alone)
                    self.runner.clear_written_slots(s, self.block_manager)
                    self._fail(s.request, f"{type(exc).__name__}: {exc}", outputs, finished)
                else:
                    self._last_activation_bytes = result.activation_bytes
                    self._update(result, outputs, finished)
        else:
            self._last_activation_bytes = result.activation_bytes
            self._update(result, outputs, finished)

    def _update(self, result: StepResult, outputs: Outputs, finished: list[Request]) -> None:
        """Each request's share of the step; one whose own processing raises (its detokenizer, its
        verification) fails alone, like one whose logits were not finite."""
        now = time.perf_counter()  # when the step's tokens came: one time for all of them
        for i, s in enumerate(result.order):
            req = s.request
            if i in result.failed:
                self._fail(req, result.failed[i], outputs, finished)
                continue
            try:
                self._update_one(i, s, result, outputs, now)
            except Exception as exc:  # noqa: BLE001 (this request's own failure: the others go on)
                self._fail(req, f"{type(exc).__name__}: {exc}", outputs, finished)
                continue
            if req.is_finished:
                self._finish(req, req.status)
                finished.append(req)

    def _update_one(self, i: int, s, result: StepResult, outputs: Outputs, now: float) -> None:
        req, bm, piece = s.request, self.block_manager, self.tokenizer.id_to_piece
        token, lp = result.sampled[i], result.logprobs[i]
        if i in result.verify_logits:
            v = self.spec.apply_verify(s, result.verify_logits[i], result.hidden.get(i), result.verify_host.get(i))
            self.counters.generated += len(v.token_ids)
            outputs[req.request_id] = make_output(req, v.token_ids, v.text, None, piece, v.sources)
            return
        before = req.num_computed_tokens
        req.num_computed_tokens += s.num_tokens
        if req.num_computed_tokens // bm.block_size > before // bm.block_size:  # a block filled up
            bm.commit(req.request_id, req.tokens, req.num_computed_tokens)
        if token is None:
            return
        if i in result.hidden:  # for the MTP heads: the state that produced this token
            req.mtp_hidden = result.hidden[i][0]
        if req.num_computed_tokens - s.num_tokens < req.num_prompt_tokens:
            self.counters.prompt += req.num_prompt_tokens
            self.counters.cached += req.num_cached_tokens if req.num_preemptions == 0 else 0
        text = append_token(req, token, self.eos_token_ids, self.max_model_len, now)
        self.counters.generated += 1
        outputs[req.request_id] = make_output(req, [token], text, [lp] if lp is not None else None, piece)

    def _fail(self, req: Request, reason: str, outputs: Outputs, finished: list[Request]) -> None:
        """One request's own failure (its forward pass raised, its logits were not finite): it
        finishes alone with finish_reason "error" and the reason, and is counted."""
        self.counters.failed += 1
        self.block_manager.uncache(req.request_id)  # what it computed may be wrong: never a cache hit
        self._close(req, RequestStatus.FINISHED_ERROR, outputs, finished, reason)

    def _close(self, req: Request, status: RequestStatus, outputs: Outputs, finished: list[Request],
               error: str | None = None) -> None:
        """Finish a request that produced nothing this step (abort, error) and publish that."""
        self._finish(req, status, error)
        outputs[req.request_id] = make_output(req, [], "", None, self.tokenizer.id_to_piece)
        finished.append(req)

    def _finish(self, req: Request, status: RequestStatus, error: str | None = None) -> None:
        req.status = status
        req.error = error
        req.finished_time = time.perf_counter()
        self.scheduler.remove(req)
        self.spec.free(req.request_id)
        self._requests.pop(req.request_id, None)
        self.counters.finished += 1

    def _publish(self, t0: float, sched: SchedulerOutput, outputs: Outputs, finished: list[Request],
                 arrived: list) -> None:
        step = self.counters.steps
        num_failed = sum(r.status is RequestStatus.FINISHED_ERROR for r in finished)
        stats = step_stats(step, t0, sched, self.scheduler, self.block_manager, len(finished),
                           self.admission.take_rejected(), num_failed,
                           self._cost.count(self.model, self.weights_bytes), self.runner.last_path)
        event = EngineStepEvent(stats=stats, outputs=tuple(outputs.values()),
                                finished=tuple(timeline(r) for r in finished), arrived=tuple(arrived),
                                spec=self.spec.step_event(step - 1),
                                lora_events=self.lora.take_events() if self.lora is not None else (),
                                lora_pool=self.lora.snapshot() if self.lora is not None else None)
        self.admission.observe(event.stats, self.scheduler.waiting)
        for listener in self._listeners:
            listener(event)

    # ---- memory between engines (the engine thread, no step running) --------------------------------
    def release_memory(self, offload_weights: bool | None = None) -> None:
        """Free the KV caches (the target's and a draft model's) and the compiled graphs, so that a
        rebuild can make the next engine in their memory (on a GPU the old cache would otherwise leave
        the new one no room). On a GPU (`offload_weights`) the weights go to host memory too: the new
        engine's profiled KV budget must not count the old weights as in use. Every request must be
        finished; restore_memory() undoes it."""
        if self.scheduler.has_unfinished():
            raise RuntimeError("release_memory with requests still running; abort them first")
        offload = self.device.type != "cpu" if offload_weights is None else offload_weights
        self._released = (self.runner.release_kv(), self.spec.release_kv(), self.model.compiled, offload)
        self.block_manager.reset_prefix_cache()  # the cached blocks' contents are gone
        if self.model.compiled:
            self.model.set_compiled(False)
        if offload:
            self.model.to("cpu")
            self.spec.move_draft("cpu")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def restore_memory(self) -> None:
        """After release_memory (the new engine could not be built): this one serves again, with an
        empty KV cache of the same size."""
        released, self._released = self._released, None
        if released is None:
            return
        blocks, draft_blocks, compiled, offloaded = released
        if offloaded:
            self.model.to(self.device)
            self.spec.move_draft(self.device)
        self.runner.restore_kv(blocks)
        self.spec.restore_kv(draft_blocks)
        if compiled:
            self.runner.set_execution(self.config.attention_backend, True, fused_decode=self.config.fused_decode,
                                      int8_activations=self.config.int8_activations,
                                      batch_invariant=self.config.batch_invariant)

    # ---- conveniences and read-only views --------------------------------------------------------
    def generate(self, prompts: str | Sequence[str] | Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 lora_names: Sequence[str | None] | None = None) -> list[RequestOutput]:
        """Run prompts to completion; returns the final RequestOutput of each, in input order.
        `lora_names`: one adapter name (or None: the base model) per prompt."""
        return generate(self, prompts, params, lora_names)

    def score(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits (len(token_ids), vocab) float32 for every position of a text, computed fresh in
        temporary KV blocks (never taken from or added to the prefix cache). Call between steps."""
        with self._step_lock, torch.inference_mode():
            return self.model.compute_logits(self.hidden_states(token_ids))

    def hidden_states(self, token_ids: Sequence[int]) -> torch.Tensor:
        """The final (normed) hidden states (len(token_ids), hidden) that the lm_head reads, computed as
        score() computes its logits."""
        with self._step_lock:
            return fresh_hidden_states(self.runner, self.block_manager, lambda: self.intake.next_id("__score-"),
                                       token_ids, self.max_model_len)

    def hidden_states_many(self, texts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """hidden_states of several texts in one forward pass (faster on a CPU: larger products); as many
        KV blocks as they need together must be free. Call between steps."""
        with self._step_lock:
            return fresh_hidden_states_many(self.runner, self.block_manager,
                                            lambda: self.intake.next_id("__score-"), texts, self.max_model_len)

    def build_quantized(self, fmt: str, group_size: int | None = None, outlier_channels: int | None = None,
                        progress: Progress | None = None, embeddings: bool | None = None) -> dict:
        return self.weights.build_quantized(self.config, fmt, group_size, outlier_channels, progress, embeddings)

    def perplexity(self, texts: Sequence[str] | None = None) -> float:
        """Perplexity of the current weights on `texts` (default: the held-out text in assets/)."""
        return perplexity(self, texts or heldout_texts())

    def stats(self) -> EngineStats:
        return engine_stats(self.counters, self.scheduler.num_preemptions, self.admission.num_rejected, self.spec)

    def compute_line(self, short: bool = False) -> str:
        """What the engine computes in and on how many threads, and why: the engine line of the app,
        `generate --stats` and the benches, e.g. "bf16 weights, fp32 prefill: this CPU has no native
        bf16; native kernels: avx2; 1 thread: 0 of 2 cores free now (load average 2.3) (--threads to set)";
        with quantized weights, what their prompt rows run through ("int4 prompt rows: int8-activation
        kernels (no native bf16; int8_activations on)")."""
        cpu = self.device.type == "cpu"
        line = compute_line(self.compute, self.threads if cpu else None, short, self.kernels_line(),
                            kernels.cpu_tier(family_for_format(self.config.quant_format)) if cpu else None)
        if short or self.device.type != "cpu" or not quant_format(self.config.quant_format).quantized:
            return line
        route = prompt_rows_in_words(self.config.int8_activations)
        return f"{line}; {self.config.quant_format} prompt rows: {route}"

    def memory(self) -> MemorySnapshot:
        bm = self.block_manager
        lora = self.lora
        if self._device_memory is None:  # NVML initialised once, on the first snapshot
            self._device_memory = DeviceMemory(self.device)
        return snapshot(self._device_memory, self.weights_bytes, self.block_bytes, bm.num_blocks, bm.num_used_blocks,
                        bm.num_cached_free_blocks, self._last_activation_bytes, self.packed_bytes,
                        lora.device_bytes if lora else 0, lora.host_bytes if lora else 0,
                        self.runner.graphs.pool_bytes if self.runner.graphs is not None else None,
                        self.weights.kv_sizing.peak_step_bytes or None if self.device.type == "cuda" else None)

    def block_map(self) -> BlockMapSnapshot:
        return self.block_manager.snapshot()

    @property
    def weights_bytes(self) -> int:
        return self.weights.weights_bytes

    @property
    def packed_bytes(self) -> int:
        return self.weights.packed_bytes

    @property
    def proposer(self):
        return self.spec.proposer

    @property
    def spec_totals(self) -> dict[str, int]:
        return self.spec.totals
