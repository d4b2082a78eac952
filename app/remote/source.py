"""RemoteSource: an OpenAI-compatible server (vLLM, SGLang, llama.cpp, inferlab) as an engine source.

Threads
  GUI thread      owns the source: command methods post to the worker and return at once;
                  `drain()` hands over what the worker published (app/source/channel.py items).
  attach worker   one thread running an asyncio loop with one httpx client: scrapes /metrics at
                  SCRAPE_HZ (parsed, rates and bucket percentiles computed here, app/remote/facts.py),
                  runs the load generator's arrivals and every streaming request (app/remote/client.py).
                  Nothing here waits for the GUI; nothing in the GUI waits for the network.

The server's kind comes from its metric prefixes (or /v1/models' owned_by). What a server cannot show
(step events, the block map, memory, quantization, sweeps) is left out of its Capabilities, and the
panels say so. A server that stops answering, answers slowly or returns garbage changes `status`
(a channel.ServerStatus); the scraper keeps trying and says when it is back.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from urllib.parse import urlsplit

import httpx

from app.load.generator import LoadConfig, LoadGenerator
from app.remote.client import StreamBudget, StreamResult, sampled_request_body, sampling_of, stream_request
from app.remote.watch import ServerWatch
from app.source import channel
from app.source.engine_info import Capabilities, EngineInfo
from app.source.notice import Notice
from engine.config import EngineConfig
from engine.events import RequestOutput, RequestTimeline

SCRAPE_HZ = 4.0
SCRAPE_TIMEOUT_S = 2.0  # /metrics slower than this: the server is "not answering"
STREAM_READ_TIMEOUT_S = 300.0  # a queued request may wait long for its first token
MAX_IN_FLIGHT = 256
MAX_EVENTS = 200_000
MAX_GAPS = 20_000  # inter-token gaps a finished stream hands over (the server panel keeps this many)
PROMPT_TAIL_WORDS = 24
WORDS_PER_TOKEN = 0.5  # a safe floor for English text with any BPE vocabulary (typically ~0.75)


class WordTokenizer:
    """The load generator's "tokenizer" for a server whose tokenizer we do not have: words of the
    held-out text. Prompt lengths are in words (a word is about 1.3 tokens); the server's usage says how
    many tokens it counted."""

    def __init__(self) -> None:
        self.words: list[str] = []
        self._ids: dict[str, int] = {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out = []
        for w in text.split():
            if w not in self._ids:
                self._ids[w] = len(self.words)
                self.words.append(w)
            out.append(self._ids[w])
        return out

    def decode(self, ids) -> str:
        return " ".join(self.words[i] for i in ids)


def base_url(url: str) -> str:
    """http://host:port from what a user types (with or without /v1, a trailing slash); ValueError else."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {url!r}")
    path = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{path}"


class RemoteSource:
    def __init__(self, url: str, api_key: str | None = None, *, load_seed: int = 0,
                 scrape_hz: float = SCRAPE_HZ, timeout_s: float = SCRAPE_TIMEOUT_S) -> None:
        self.sigLoadProgress = Notice()  # (message, fraction); load notices: app/source/notice.py
        self.sigLoaded = Notice()  # (EngineInfo), from the worker at the server's first answer
        self.sigLoadFailed = Notice()  # (message)
        self.url = base_url(url)
        self.api_key = api_key
        self.config = EngineConfig()  # the knobs' defaults; the server keeps its own settings
        self.info: EngineInfo | None = None
        self.load_error: str | None = None
        self.watch = ServerWatch(self.url, timeout_s, self.publish, self._on_first_answer)
        self.scrape_interval_s = 1.0 / scrape_hz
        self._events: deque = deque(maxlen=MAX_EVENTS)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._pending: list = []  # commands posted before the worker's loop runs
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._tasks: dict[str, asyncio.Task] = {}
        self._ours: set[str] = set()
        self._budget = StreamBudget()  # what every stream in flight holds together
        self._words = WordTokenizer()
        self.loadgen = LoadGenerator(LoadConfig(), self._words, load_seed)

    # --- lifecycle (GUI thread) -----------------------------------------------------------------
    def start(self) -> None:
        self.sigLoadProgress.emit(f"connecting to {self.url}", 0.0)
        self._thread = threading.Thread(target=self._run, name="inferlab-attach", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> bool:
        self._stopping.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def loaded(self) -> bool:
        return self.info is not None

    # what the scraper learnt (app/remote/watch.py)
    @property
    def name(self) -> str:
        return self.watch.name

    @property
    def status(self) -> tuple[str, str]:
        return self.watch.status

    @property
    def kind(self) -> str | None:
        return self.watch.kind

    @property
    def facts(self):
        return self.watch.facts

    def drain(self, limit: int | None = None) -> list:
        """Everything the worker published since the last call, oldest first (app/source/channel.py)."""
        return channel.drain(self._events, limit)

    # --- commands (any thread) --------------------------------------------------------------------
    def submit_prompt(self, text: str, params, chat: bool) -> tuple[str, bool]:
        """A user's prompt as a streaming request; chat: the server applies its own chat template."""
        rid = self.add_request(text, params, chat=chat, request_id=f"user-{next(self._ids)}")
        return rid, chat

    def add_request(self, prompt, params, *, chat: bool = False, request_id: str | None = None, **_kw) -> str:
        self._require_connected()
        if not isinstance(prompt, str):
            raise ValueError("an attached server takes text prompts (it has its own tokenizer)")
        if len(self._tasks) >= MAX_IN_FLIGHT:
            raise RuntimeError(f"{MAX_IN_FLIGHT} requests are already in flight to {self.name}")
        rid = request_id or f"req-{next(self._ids)}"
        sampling = sampling_of(params)
        self._post(lambda: self._launch(rid, prompt, sampling, chat))
        return rid

    def abort(self, request_id: str) -> None:
        self._post(lambda: self._cancel(request_id))

    def reconfigure(self, **knobs) -> None:
        if knobs:
            raise RuntimeError(f"{', '.join(knobs)}: set when the server starts; {self.name} does not change "
                               "them from a client")

    def reload(self, **config_changes) -> None:
        raise RuntimeError(f"rebuilding the engine is not offered by {self.name}")

    def quantize(self, bits: int, group_size: int | None = None) -> None:
        raise RuntimeError(f"requantizing is not offered by {self.name}")

    def adopt_perplexity(self, by_bits: dict[int, float]) -> None:
        raise RuntimeError(f"requantizing is not offered by {self.name}")

    def start_load(self) -> None:
        self._post(lambda: self.loadgen.start(time.perf_counter()))

    def stop_load(self) -> None:
        self._post(self.loadgen.stop)

    def burst(self, n: int) -> None:
        self._post(lambda: self.loadgen.burst(int(n), time.perf_counter()))

    def set_load_config(self, config: LoadConfig) -> None:
        self._post(lambda: self.loadgen.set_config(config, time.perf_counter()))

    def set_arrival_rate(self, rate: float) -> None:
        self._post(lambda: self.loadgen.set_rate(float(rate), time.perf_counter()))

    def reset(self) -> None:
        self._post(self._reset)

    def run_measurement(self, job) -> None:
        self.publish(channel.Message(f"measurements run the embedded engine; not offered by {self.name}"))

    def cancel_measurement(self) -> None:
        pass

    def use_loras(self, mix: tuple[str, ...]) -> None:
        self.publish(channel.Message(f"mixing LoRA adapters into the load is not offered by {self.name}"))

    def ask_every_adapter(self, prompt: str, chat: bool = True) -> None:
        raise RuntimeError(f"asking every LoRA adapter is not offered by {self.name}")

    def _require_connected(self) -> None:
        if self.info is None:
            raise RuntimeError(f"not connected to {self.url} yet")

    def publish(self, item) -> None:
        self._events.append(item)

    def _post(self, fn) -> None:
        """Run `fn` in the worker's loop; before it runs, at its start; after shutdown, never."""
        with self._lock:
            loop = self._loop
            if self._stopping.is_set():
                return
            if loop is None:
                self._pending.append(fn)
                return
            try:
                loop.call_soon_threadsafe(fn)
            except RuntimeError:  # the loop closed under us (the worker ended on its own)
                pass

    # --- worker thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # noqa: BLE001 (the window must hear of it, not lose the thread silently)
            self.publish(channel.Message(f"the attach worker stopped: {type(exc).__name__}: {exc}"))

    async def _main(self) -> None:
        timeout = httpx.Timeout(self.watch.timeout_s, read=STREAM_READ_TIMEOUT_S)
        limits = httpx.Limits(max_connections=MAX_IN_FLIGHT + 4, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=self._headers()) as client:
            self._client = client
            with self._lock:
                self._loop = asyncio.get_running_loop()
                pending, self._pending = self._pending, []
            for fn in pending:
                fn()
            scraper = asyncio.create_task(self.watch.run(client, self.scrape_interval_s))
            while not self._stopping.is_set():
                if scraper.done():  # it catches every failure of a look; should it end anyway, it restarts
                    self.publish(channel.Message(f"the scraper of {self.url} stopped ({_ended_why(scraper)}); "
                                                 "restarting it"))
                    scraper = asyncio.create_task(self.watch.run(client, self.scrape_interval_s))
                now = time.perf_counter()
                for arrival in self.loadgen.due(now):
                    self._launch_arrival(arrival)
                wait = min(0.05, max(0.0, self.loadgen.next_due() - time.perf_counter()))
                await asyncio.sleep(wait)
            scraper.cancel()
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(scraper, *tasks, return_exceptions=True)
        with self._lock:
            self._loop = None
            self._stopping.set()  # a worker that ended on its own takes no more commands either

    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _on_first_answer(self, has_metrics: bool) -> None:
        """The scraper knows the server: the window learns what it can show."""
        w = self.watch
        if w.max_model_len:  # lengths are in words: leave room for a word being several tokens
            self.loadgen = LoadGenerator(self.loadgen.config, self._words, 0,
                                         max_model_len=int(w.max_model_len * WORDS_PER_TOKEN))
        self.info = EngineInfo(
            source=w.name, model=w.model_id or "(unnamed)", model_path=self.url, device="remote",
            dtype="(the server's)", max_model_len=w.max_model_len or 0, num_kv_blocks=0, block_size=0,
            has_chat_template=True,
            capabilities=self._capabilities(has_metrics), config={"server_kind": w.kind, **self._info_config()})
        self.sigLoaded.emit(self.info)

    def _capabilities(self, has_metrics: bool) -> Capabilities:
        """What a server we only watch offers (a managed one adds its restartable knobs)."""
        return Capabilities(load_generator=True, server_metrics=has_metrics, client_timings=True)

    def _info_config(self) -> dict:
        return {}

    # requests
    def _launch_arrival(self, arrival) -> None:
        if self.info is None or len(self._tasks) >= MAX_IN_FLIGHT:
            self.loadgen.on_submitted(None, arrival, time.perf_counter())
            return
        rid = f"load-{next(self._ids)}"
        text = self._words.decode(arrival.prompt_token_ids)
        self._ours.add(rid)
        self.loadgen.on_submitted(rid, arrival, time.perf_counter())
        words = text.split()
        tail = " ".join(words[-PROMPT_TAIL_WORDS:])
        self.publish(channel.LoadStream(rid, arrival.kind, ("… " if len(words) > PROMPT_TAIL_WORDS else "")
                                        + tail + f"   [{len(words)} words]"))
        self._launch(rid, text, arrival.sampling, chat=False)

    def _launch(self, rid: str, prompt: str, sampling: dict, chat: bool) -> None:
        if self.info is None:
            return
        path, body = sampled_request_body(self.watch.model_id or "default", prompt, sampling, chat)
        res = StreamResult(rid, time.perf_counter())
        self.publish(channel.ClientSent(rid, res.sent))
        self._tasks[rid] = asyncio.get_running_loop().create_task(self._stream(res, path, body))

    async def _stream(self, res: StreamResult, path: str, body: dict) -> None:
        try:
            await stream_request(self._client, self.url, path, body, res, on_text=self._on_text,
                                 budget=self._budget)
        except asyncio.CancelledError:
            pass  # an abort: the stream is closed, the server drops the request
        except Exception as exc:  # noqa: BLE001 (whatever the server's answer broke: this request ends with it)
            res.finish_reason, res.error = "error", f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            self._tasks.pop(res.request_id, None)
            self._finished(res)

    def _on_text(self, res: StreamResult, text: str, t: float) -> None:
        # (the whole text travels once, when the stream ends: a copy of it on every chunk, each held by a
        # queued event, grows as the square of the stream; the panels read the delta)
        out = RequestOutput(res.request_id, (), text, (), "", False, ttft_s=res.ttft_s,
                            tokens_per_s=res.tokens_per_s())
        self.publish(channel.ClientOutput(out, t, 1))

    def _finished(self, res: StreamResult) -> None:
        end = res.finished or time.perf_counter()
        out = RequestOutput(res.request_id, (), "", (), res.text, True, finish_reason=res.finish_reason,
                            num_prompt_tokens=res.prompt_tokens or 0, error=res.error, ttft_s=res.ttft_s,
                            tokens_per_s=res.tokens_per_s())
        self.publish(channel.ClientOutput(out, end, 0))
        tl = RequestTimeline(res.request_id, res.sent, res.prompt_tokens or 0, first_token=res.first_token,
                             finished=end, num_output_tokens=res.num_tokens, finish_reason=res.finish_reason)
        self.publish(channel.ClientFinished(tl, tuple(res.inter_token_s()[-MAX_GAPS:]), res.error))
        if res.request_id in self._ours:
            self._ours.discard(res.request_id)
            self.loadgen.on_finished(res.request_id, end)

    def _cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    def _reset(self) -> None:
        self.loadgen.clear()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()

        async def after_aborts() -> None:  # the aborted streams' last items come before the Reset
            await asyncio.gather(*tasks, return_exceptions=True)
            self.publish(channel.Reset())

        asyncio.get_running_loop().create_task(after_aborts())

    @property
    def in_flight(self) -> int:
        return len(self._tasks)


def _ended_why(task: asyncio.Task) -> str:
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return f"{type(exc).__name__}: {str(exc)[:200]}" if exc is not None else "it returned"
