"""LLMEngine: add_request / abort / step(). One step = schedule -> run -> update -> publish events."""
from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Sequence

import torch

from engine.config import EngineConfig
from engine.core.admission import AdmissionController, RequestRejected
from engine.core.block_manager import BlockManager
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.output_processor import append_token, make_output, timeline
from engine.core.policies import make_policy
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.events import EngineStepEvent, RequestOutput, StepStats
from engine.loading.loader import LoadedModel, load_model
from engine.models.layers.linear import pack_linears
from engine.models.llama import LlamaForCausalLM
from engine.perf.step_counter import StepCounter
from engine.quant.manager import QuantizedWeights
from engine.quant.weight_only import original_weights, swap_modules
from engine.queries import EngineQueries, EngineStats  # noqa: F401 (EngineStats: public)
from engine.runner.kernels import native_decode_applies, paged_decode_kernel
from engine.runner.memory import weights_bytes
from engine.runner.model_runner import ModelRunner
from engine.runner.setup import kv_block_bytes, kv_blocks_after_requant, num_kv_blocks, resolve_device, resolve_dtype
from engine.sampling_params import SamplingParams
from engine.spec.decoder import SpeculativeDecoding

StepListener = Callable[[EngineStepEvent], None]


class LLMEngine(QuantizedWeights, SpeculativeDecoding, EngineQueries):
    def __init__(self, config: EngineConfig | None = None, *, loaded: LoadedModel | None = None,
                 progress: Callable[[str, float], None] | None = None) -> None:
        self.config = config = config or EngineConfig()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        loaded = loaded or load_model(config.model, progress=progress)
        self.tokenizer = loaded.tokenizer
        self.model_path = loaded.path
        self.model_config = mc = loaded.config
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.block_bytes = kv_block_bytes(mc, config.block_size, self.dtype)
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(mc, max_positions=mc.max_position_embeddings)
        model.load_weights(loaded.state_dict)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.model.rotary.cos, self.model.rotary.sin = (  # keep RoPE tables in float32
            self.model.rotary.cos.float(), self.model.rotary.sin.float())
        self.model.set_attention_backend(config.attention_backend)
        # The 16-bit weights of every quantizable layer: the source of every (re)quantization.
        self._originals = {n: w.to("cpu") if self.device.type != "cpu" else w
                           for n, w in original_weights(self.model).items()}
        self._act_absmax: dict[str, torch.Tensor] | None = None
        weights16 = weights_bytes(self.model)
        if config.quant_bits != 16 or config.quant_embeddings:
            swap_modules(self.model, self.build_quantized(config.quant_bits))
        weights_saved = weights16 - weights_bytes(self.model)
        self.packed_bytes = pack_linears(self.model, config.pack_weights)
        self.weights_bytes = weights_bytes(self.model)  # with the packed copies
        blocks = num_kv_blocks(config, self.device, self.block_bytes, self.weights_bytes, weights_saved)
        self._kv_base = (blocks, self.weights_bytes)  # runtime requantization resizes the cache from here
        self._kv_target = blocks
        self.max_model_len = min(config.max_model_len or mc.max_position_embeddings,
                                 mc.max_position_embeddings, blocks * config.block_size)
        self.block_manager = BlockManager(blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.runner = ModelRunner(self.model, mc, blocks, config.block_size, self.device, self.dtype)
        self._set_compiled(config.compile)
        if config.attention_backend == "native" and native_decode_applies(mc, self.device, self.dtype):
            self.runner.native_decode = paged_decode_kernel(progress)
        self._requests: dict[str, Request] = {}
        self._inbox: list[tuple[str, object]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._seed_rng = random.Random(config.seed)
        self._listeners: list[StepListener] = []
        self._step = 0
        self._last_activation_bytes = 0
        self._cost = StepCounter(mc, torch.empty((), dtype=self.dtype).element_size())  # FLOPs/bytes per step
        self._counts = dict(requests=0, finished=0, prompt=0, generated=0, cached=0)
        self._init_spec(loaded)
        self.admission = AdmissionController(config)
        self._num_rejected = 0  # cumulative; each StepStats carries the rejections since the last step
        self._num_rejected_published = 0

    # ---- requests ------------------------------------------------------------------------------
    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, priority: int = 0) -> str:
        """Validate and queue a request (thread-safe). Raises ValueError for a bad request and
        RequestRejected (engine.admission) when admission control refuses it (config.max_queue_len,
        config.max_predicted_wait_s)."""
        params = params or SamplingParams()
        params.validate()
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt) if prompt else []
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty")
        if any(t < 0 or t >= self.model_config.vocab_size for t in ids):
            raise ValueError(f"prompt token ids must lie in [0, {self.model_config.vocab_size})")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds the context "
                f"length of {self.max_model_len} tokens")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(62)
        req = Request(rid, ids, params, priority=priority)
        req.seed = seed  # its torch.Generator is made in the engine thread, when the request is drained
        req.detokenizer = IncrementalDetokenizer(self.tokenizer, ids, params.stop)
        with self._lock:
            if rid in self._requests or any(c == "add" and r.request_id == rid for c, r in self._inbox):
                raise ValueError(f"request id {rid!r} is already in use")
            self._admit_or_reject()
            self._inbox.append(("add", req))
        return rid

    def _admit_or_reject(self) -> None:
        """Admission control, with self._lock held: the queue after the last step plus requests not yet
        drained. Raises RequestRejected (and counts it) when one more would break a limit."""
        pending = [r for c, r in self._inbox if c == "add"]
        try:  # len() of the live deque is safe from any thread; drained requests are in it at once
            self.admission.check(self.admission.queue(len(self.scheduler.waiting), pending))
        except RequestRejected:
            self._num_rejected += 1
            raise

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._inbox.append(("abort", request_id))

    RECONFIGURABLE = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "policy",
                      "max_queue_len", "max_predicted_wait_s", "num_speculative_tokens", "spec_method", "compile")

    def reconfigure(self, **changes) -> None:
        """Change scheduling knobs between steps (thread-safe; applied at the top of the next step).
        Raises ValueError for a knob that cannot change at run time or a bad value."""
        unknown = set(changes) - set(self.RECONFIGURABLE)
        if unknown:
            raise ValueError(f"cannot change {sorted(unknown)} at run time; reconfigurable: {self.RECONFIGURABLE}")
        if changes.get("max_num_seqs", 1) < 1 or changes.get("max_num_batched_tokens", 1) < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if "policy" in changes:
            make_policy(changes["policy"])  # validate now, in the caller's thread
        if not 0 <= changes.get("num_speculative_tokens", 0) <= 8:
            raise ValueError("num_speculative_tokens must be between 0 and 8")
        self._check_spec_switch(changes.get("spec_method", self.config.spec_method))
        with self._lock:
            self._inbox.append(("config", changes))

    def _set_compiled(self, on: bool) -> None:
        """compile=True: the model's dense regions and single-row kernel, and the gather-fused decode
        attention (unless the readable reference path was asked for); compiled lazily by the next steps."""
        self.model.set_compiled(on)
        backend = self.config.attention_backend
        self.runner.fused_decode = backend == "compiled" or (on and backend != "reference")

    def has_unfinished(self) -> bool:
        with self._lock:
            pending = bool(self._inbox)
        return pending or self.scheduler.has_unfinished()

    def add_listener(self, listener: StepListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: StepListener) -> None:
        self._listeners.remove(listener)

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        outputs: dict[str, RequestOutput] = {}
        finished: list[Request] = []
        arrived = self._drain_inbox(outputs, finished)
        if self._kv_target != self.block_manager.num_blocks:
            self._resize_kv()
        self._begin_spec_step()
        self._propose()
        sched = self.scheduler.schedule()
        if sched.is_empty and not outputs and not arrived:
            return []
        self._cost.begin(sched)
        for req in sched.preempted:
            req.status = RequestStatus.PREEMPTED
        if not sched.is_empty:
            try:
                result = self.runner.execute(sched, self.block_manager)
            except Exception as exc:  # a failing batch fails alone; the engine keeps serving
                for s in sched.scheduled:
                    self._finish(s.request, RequestStatus.FINISHED_ERROR, f"{type(exc).__name__}: {exc}")
                    outputs[s.request.request_id] = make_output(s.request, [], "", None, self.tokenizer.id_to_piece)
                    finished.append(s.request)
            else:
                self._last_activation_bytes = result.activation_bytes
                self._update(result, outputs, finished)
        self._step += 1
        event = EngineStepEvent(
            stats=self._step_stats(t0, sched, len(finished)),
            outputs=tuple(outputs.values()),
            finished=tuple(timeline(r) for r in finished),
            arrived=tuple(arrived),
            spec=self._spec_event(self._step - 1),
        )
        self.admission.observe(event.stats, self.scheduler.waiting)
        for listener in self._listeners:
            listener(event)
        return list(outputs.values())

    def _drain_inbox(self, outputs: dict[str, RequestOutput], finished: list[Request]) -> list:
        with self._lock:
            inbox, self._inbox = self._inbox, []
        arrived = []
        for cmd, arg in inbox:
            if cmd == "add":
                arg.generator = torch.Generator(device=self.device).manual_seed(arg.seed)
                self._requests[arg.request_id] = arg
                self.scheduler.add(arg)
                self._counts["requests"] += 1
                arrived.append((arg.request_id, arg.arrival_time, arg.num_prompt_tokens))
            elif cmd == "config":
                for key, value in arg.items():
                    setattr(self.config, key, value)
                if "policy" in arg:
                    self.scheduler.policy = make_policy(arg["policy"])
                if "spec_method" in arg:
                    self._switch_spec(arg["spec_method"])
                if "compile" in arg and bool(arg["compile"]) != self.model.compiled:
                    self._set_compiled(bool(arg["compile"]))
            elif cmd == "swap":
                modules, settings = arg
                swap_modules(self.model, modules)
                self.packed_bytes = pack_linears(self.model, self.config.pack_weights)
                self.model.set_compiled(self.model.compiled)  # new 16-bit layers get the single-row kernel
                for key, value in settings.items():
                    setattr(self.config, key, value)
                self.weights_bytes = weights_bytes(self.model)
                self._kv_target = kv_blocks_after_requant(self.config, *self._kv_base, self.weights_bytes,
                                                          self.block_bytes)
            elif cmd == "abort":
                req = self._requests.get(arg)
                if req is not None and not req.is_finished:
                    self._finish(req, RequestStatus.FINISHED_ABORTED)
                    outputs[req.request_id] = make_output(req, [], "", None, self.tokenizer.id_to_piece)
                    finished.append(req)
        return arrived

    def _update(self, result, outputs: dict[str, RequestOutput], finished: list[Request]) -> None:
        bm = self.block_manager
        for i, (s, token, lp) in enumerate(zip(result.order, result.sampled, result.logprobs)):
            if i in result.verify_logits:
                self._apply_verify(s, result.verify_logits[i], outputs, finished, result.hidden.get(i))
                continue
            req = s.request
            before = req.num_computed_tokens
            req.num_computed_tokens += s.num_tokens
            if req.num_computed_tokens // bm.block_size > before // bm.block_size:  # a block filled up
                bm.commit(req.request_id, req.all_token_ids, req.num_computed_tokens)
            if token is None:
                continue
            if i in result.hidden:  # for the MTP heads: the state that produced this token
                req.mtp_hidden = result.hidden[i][0]
            if req.num_computed_tokens - s.num_tokens < req.num_prompt_tokens:
                self._counts["prompt"] += req.num_prompt_tokens
                self._counts["cached"] += req.num_cached_tokens if req.num_preemptions == 0 else 0
            text = append_token(req, token, self.eos_token_ids, self.max_model_len)
            self._counts["generated"] += 1
            outputs[req.request_id] = make_output(
                req, [token], text, [lp] if lp is not None else None, self.tokenizer.id_to_piece)
            if req.is_finished:
                self._finish(req, req.status)
                finished.append(req)

    def _finish(self, req: Request, status: RequestStatus, error: str | None = None) -> None:
        req.status = status
        req.error = error
        req.finished_time = time.perf_counter()
        self.scheduler.remove(req)
        self._free_spec(req.request_id)
        self._requests.pop(req.request_id, None)
        self._counts["finished"] += 1

    def _step_stats(self, t0: float, sched, num_finished: int) -> StepStats:
        bm = self.block_manager
        flops, bytes_moved = self._cost.count(self.model, self.weights_bytes)
        return StepStats(
            step=self._step,
            t_start=t0,
            wall_time_s=time.perf_counter() - t0,
            num_prefill_tokens=sched.num_prefill_tokens,
            num_decode_tokens=sched.num_decode_tokens,
            num_verify_tokens=sched.num_verify_tokens,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_preempted=len(sched.preempted),
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_total=bm.num_blocks,
            num_finished=num_finished,
            num_rejected=self._take_rejected(),
            scheduled=tuple((s.request.request_id, s.num_tokens, s.kind) for s in sched.scheduled),
            flops=flops, bytes_moved=bytes_moved,
        )

    def _take_rejected(self) -> int:
        with self._lock:
            n, self._num_rejected_published = self._num_rejected - self._num_rejected_published, self._num_rejected
        return n
