"""RemoteSource: an OpenAI-compatible server (vLLM, SGLang, llama.cpp, inferlab) as an engine source.

Threads
  GUI thread      owns the source (a QObject): command methods post to the worker and return at once;
                  `drain()` hands over what the worker published (app/channel.py items).
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
from PySide6.QtCore import QObject, Signal

from app import channel
from app.engine_info import Capabilities, EngineInfo
from app.load.generator import LoadConfig, LoadGenerator
from app.remote.client import StreamResult, request_body, stream_request
from app.remote.facts import FactsTracker
from app.remote.metrics import KIND_NAMES, MetricsError, parse_metrics, server_kind
from engine.config import EngineConfig
from engine.events import RequestOutput, RequestTimeline

SCRAPE_HZ = 4.0
SCRAPE_TIMEOUT_S = 2.0  # /metrics slower than this: the server is "not answering"
SLOW_S = 0.75  # /metrics slower than this: "answers slowly"
RETRY_S = 1.0
STREAM_READ_TIMEOUT_S = 300.0  # a queued request may wait long for its first token
MAX_IN_FLIGHT = 256
MAX_EVENTS = 200_000
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


class RemoteSource(QObject):
    sigLoadProgress = Signal(str, float)
    sigLoaded = Signal(object)  # EngineInfo
    sigLoadFailed = Signal(str)

    def __init__(self, url: str, api_key: str | None = None, *, load_seed: int = 0,
                 scrape_hz: float = SCRAPE_HZ, timeout_s: float = SCRAPE_TIMEOUT_S, parent=None) -> None:
        super().__init__(parent)
        self.url = base_url(url)
        self.name = self.url  # until the kind is known: then "vLLM at http://…"
        self.api_key = api_key
        self.config = EngineConfig()  # the knobs' defaults; the server keeps its own settings
        self.info: EngineInfo | None = None
        self.load_error: str | None = None
        self.status: tuple[str, str] = ("connecting", f"connecting to {self.url}…")
        self.kind: str | None = None
        self.model_id: str | None = None
        self.facts = None  # the latest ServerFacts (worker thread writes, anyone reads)
        self.scrape_interval_s = 1.0 / scrape_hz
        self.timeout_s = timeout_s
        self._events: deque = deque(maxlen=MAX_EVENTS)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._pending: list = []  # commands posted before the worker's loop runs
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._tasks: dict[str, asyncio.Task] = {}
        self._ours: set[str] = set()
        self._words = WordTokenizer()
        self.loadgen = LoadGenerator(LoadConfig(), self._words, load_seed)
        self._tracker: FactsTracker | None = None
        self._owned_by = ""
        self._max_model_len: int | None = None

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

    def drain(self, limit: int | None = None) -> list:
        """Everything the worker published since the last call, oldest first (app/channel.py)."""
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
        sampling = {"max_tokens": params.max_tokens, "temperature": params.temperature, "seed": params.seed,
                    "ignore_eos": params.ignore_eos}
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

    def _require_connected(self) -> None:
        if self.info is None:
            raise RuntimeError(f"not connected to {self.url} yet")

    def publish(self, item) -> None:
        self._events.append(item)

    def _post(self, fn) -> None:
        with self._lock:
            loop = self._loop
            if loop is None:
                self._pending.append(fn)
                return
        loop.call_soon_threadsafe(fn)

    # --- worker thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # noqa: BLE001 (the window must hear of it, not lose the thread silently)
            self.publish(channel.Message(f"the attach worker stopped: {type(exc).__name__}: {exc}"))

    async def _main(self) -> None:
        timeout = httpx.Timeout(self.timeout_s, read=STREAM_READ_TIMEOUT_S)
        limits = httpx.Limits(max_connections=MAX_IN_FLIGHT + 4, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=self._headers()) as client:
            self._client = client
            with self._lock:
                self._loop = asyncio.get_running_loop()
                pending, self._pending = self._pending, []
            for fn in pending:
                fn()
            scraper = asyncio.create_task(self._scrape_forever())
            while not self._stopping.is_set():
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

    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    # scraping
    async def _scrape_forever(self) -> None:
        while True:
            t0 = time.perf_counter()
            ok = await self._scrape_once()
            pause = self.scrape_interval_s if ok else RETRY_S
            await asyncio.sleep(max(0.0, pause - (time.perf_counter() - t0)))

    async def _scrape_once(self) -> bool:
        """One look at the server; False when it is down (the next try waits RETRY_S)."""
        if self.model_id is None or self.status[0] == "down":
            models = await self._fetch_models()
            if models is False and self.status[0] in ("connecting", "down"):
                return False
        t0 = time.perf_counter()
        try:
            resp = await self._client.get(self.url + "/metrics", timeout=self.timeout_s)
        except httpx.TimeoutException:
            self._set_status("down", f"{self.url} did not answer /metrics within {self.timeout_s:.0f} s; "
                                     f"retrying every {RETRY_S:.0f} s")
            return False
        except httpx.HTTPError as exc:
            self._set_status("down", f"{self.url} is not answering ({type(exc).__name__}); retrying every "
                                     f"{RETRY_S:.0f} s")
            return False
        elapsed = time.perf_counter() - t0
        if resp.status_code in (404, 405, 501):
            self._connected(None)
            self._set_status("no-metrics", f"{self.name} publishes no /metrics (HTTP {resp.status_code}; "
                                           "llama-server needs --metrics): client-side facts only")
            return True
        if resp.status_code != 200:
            self._set_status("garbage", f"{self.url}/metrics answered HTTP {resp.status_code}; retrying")
            return False
        try:
            scrape = parse_metrics(resp.text, time.perf_counter())
        except MetricsError as exc:
            self._set_status("garbage", f"{self.url}/metrics returned something else than metrics ({exc}); "
                                        "retrying")
            return False
        self._connected(scrape)
        facts = self._tracker.add(scrape)
        self.facts = facts
        self.publish(channel.ServerSample(facts))
        if elapsed > SLOW_S:
            self._set_status("slow", f"{self.name} answers slowly: /metrics took {elapsed:.1f} s")
        else:
            self._set_status("connected", f"attached to {self.name}")
        return True

    async def _fetch_models(self) -> bool | None:
        """/v1/models: the model id requests name and the context length where the server says it.
        False when the server is unreachable, None when it answered without a usable list."""
        try:
            resp = await self._client.get(self.url + "/v1/models", timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            self._set_status("down", f"{self.url} is not answering ({type(exc).__name__}); retrying every "
                                     f"{RETRY_S:.0f} s")
            return False
        try:
            data = resp.json()["data"][0]
            self.model_id = str(data["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            if resp.status_code == 401:
                self._set_status("down", f"{self.url} refused the API key (HTTP 401): attach with --api-key")
                return False
            return None
        self._owned_by = str(data.get("owned_by") or "")
        for key in ("max_model_len", "context_length"):
            if isinstance(data.get(key), int):
                self._max_model_len = data[key]
        meta = data.get("meta")
        if isinstance(meta, dict) and isinstance(meta.get("n_ctx_train"), int):
            self._max_model_len = self._max_model_len or meta["n_ctx_train"]
        return True

    def _connected(self, scrape) -> None:
        """The first answer: the kind of server, then the window learns what it can show."""
        if self.info is not None:
            return
        self.kind = server_kind(scrape, self._owned_by) or "openai"
        self.name = f"{KIND_NAMES.get(self.kind, 'the server')} at {self.url}"
        self._tracker = FactsTracker(self.kind)
        if self._max_model_len:  # lengths are in words: leave room for a word being several tokens
            self.loadgen = LoadGenerator(self.loadgen.config, self._words, 0,
                                         max_model_len=int(self._max_model_len * WORDS_PER_TOKEN))
        self.info = EngineInfo(
            source=self.name, model=self.model_id or "(unnamed)", model_path=self.url, device="remote",
            dtype="(the server's)", max_model_len=self._max_model_len or 0, num_kv_blocks=0, block_size=0,
            has_chat_template=True,
            capabilities=Capabilities(load_generator=True, server_metrics=scrape is not None, client_timings=True),
            config={"server_kind": self.kind})
        self.sigLoaded.emit(self.info)

    def _set_status(self, state: str, text: str) -> None:
        if state == "connected" and self.status[0] in ("down", "garbage"):
            text = f"reconnected: {text}"
        elif state == "connected" and self.status[0] == "connected":
            text = self.status[1]  # stays "reconnected: …" until the next change
        if self.status != (state, text):
            self.status = (state, text)
            self.publish(channel.ServerStatus(state, text))

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
        path, body = request_body(self.model_id or "default", prompt, max_tokens=sampling.get("max_tokens") or 16,
                                  temperature=sampling.get("temperature", 0.8), chat=chat,
                                  seed=sampling.get("seed"), ignore_eos=bool(sampling.get("ignore_eos")))
        res = StreamResult(rid, time.perf_counter())
        self.publish(channel.ClientSent(rid, res.sent))
        self._tasks[rid] = asyncio.get_running_loop().create_task(self._stream(res, path, body))

    async def _stream(self, res: StreamResult, path: str, body: dict) -> None:
        try:
            await stream_request(self._client, self.url, path, body, res, on_text=self._on_text)
        except asyncio.CancelledError:
            pass  # an abort: the stream is closed, the server drops the request
        finally:
            self._tasks.pop(res.request_id, None)
            self._finished(res)

    def _on_text(self, res: StreamResult, text: str, t: float) -> None:
        out = RequestOutput(res.request_id, (), text, (), res.text, False, ttft_s=res.ttft_s,
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
        self.publish(channel.ClientFinished(tl, tuple(res.inter_token_s()), res.error))
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
