"""ServerWatch: the scraping half of an attached source (app/remote/source.py), run in its worker thread.

Reads /v1/models (the model id requests name, the context length where the server says it) and scrapes
/metrics every `interval_s` with a timeout: parsed (app/remote/metrics.py), turned into ServerFacts
(app/remote/facts.py) and published. The connection's state is published on every change, with why:
connecting, connected, slow (/metrics took over SLOW_S), down (no answer, or none within the timeout),
garbage (an answer that is not metrics), no-metrics (the server publishes none: client-side facts only).
A down server is retried every RETRY_S; "reconnected" says it is back.

Every read is bounded in size and total time (app/remote/bounded.py): a body that never ends or arrives a
byte a second is a status ("down", "garbage"), not a worker stuck or growing. Any failure of one look,
whatever raised it, is a visible status and the next look comes RETRY_S later: the scraper never dies.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx

from app.remote.bounded import ReadLimit, fetch
from app.remote.facts import FactsTracker
from app.remote.metrics import KIND_NAMES, MAX_PAYLOAD_CHARS, MetricsError, parse_metrics, server_kind
from app.source import channel

SLOW_S = 0.75  # /metrics slower than this: "answers slowly"
RETRY_S = 1.0
MAX_MODELS_BYTES = 2**20  # /v1/models: a list of a few model cards
MAX_CONTEXT = 2**31  # a context length beyond this is not one


class ServerWatch:
    def __init__(self, url: str, timeout_s: float, publish: Callable, on_first_answer: Callable) -> None:
        """publish(item): hand a channel item to the GUI; on_first_answer(has_metrics): the server is known."""
        self.url = url
        self.timeout_s = timeout_s
        self.publish = publish
        self.on_first_answer = on_first_answer
        self.name = url  # until the kind is known: then "vLLM at http://…"
        self.status: tuple[str, str] = ("connecting", f"connecting to {url}…")
        self.kind: str | None = None
        self.model_id: str | None = None
        self.max_model_len: int | None = None
        self.facts = None  # the latest ServerFacts (worker thread writes, anyone reads)
        self.answered = False
        self.paused = False  # a managed server restarting: its absence is expected, not a status
        self._owned_by = ""
        self._tracker: FactsTracker | None = None
        self._client: httpx.AsyncClient | None = None

    async def run(self, client: httpx.AsyncClient, interval_s: float) -> None:
        self._client = client
        while True:
            t0 = time.perf_counter()
            if self.paused:
                await asyncio.sleep(interval_s)
                continue
            try:
                ok = await self.scrape_once()
            except Exception as exc:  # noqa: BLE001 (a monitor survives what it monitors: say it, look again)
                self.set_status("garbage", f"reading {self.url} failed ({type(exc).__name__}: {str(exc)[:200]}); "
                                           f"retrying every {RETRY_S:.0f} s")
                ok = False
            pause = interval_s if ok else RETRY_S
            await asyncio.sleep(max(0.0, pause - (time.perf_counter() - t0)))

    async def scrape_once(self) -> bool:
        """One look at the server; False when it is down (the next try waits RETRY_S)."""
        if self.model_id is None or self.status[0] == "down":
            models = await self._fetch_models()
            if models is False and self.status[0] in ("connecting", "down"):
                return False
        t0 = time.perf_counter()
        try:
            status, body = await fetch(self._client, self.url + "/metrics", max_bytes=MAX_PAYLOAD_CHARS,
                                       total_s=self.timeout_s)
        except ReadLimit as exc:
            if exc.too_slow:
                self.set_status("down", f"{self.url} did not answer /metrics within {self.timeout_s:.0f} s (the "
                                         f"whole answer); retrying every {RETRY_S:.0f} s")
            else:
                self.set_status("garbage", f"{exc}: not a metrics page; retrying every {RETRY_S:.0f} s")
            return False
        except httpx.TimeoutException:
            self.set_status("down", f"{self.url} did not answer /metrics within {self.timeout_s:.0f} s; "
                                     f"retrying every {RETRY_S:.0f} s")
            return False
        except (httpx.RemoteProtocolError, httpx.DecodingError) as exc:  # it answered, but not whole HTTP
            self.set_status("garbage", f"{self.url}/metrics broke off or is not HTTP ({_said(exc)}); retrying "
                                        f"every {RETRY_S:.0f} s")
            return False
        except httpx.HTTPError as exc:
            self.set_status("down", f"{self.url} is not answering ({_said(exc)}); retrying every {RETRY_S:.0f} s")
            return False
        elapsed = time.perf_counter() - t0
        if status in (404, 405, 501):
            self._first_answer(None)
            self.set_status("no-metrics", f"{self.name} publishes no /metrics (HTTP {status}; "
                                           "llama-server needs --metrics): client-side facts only")
            return True
        if status != 200:
            self.set_status("garbage", f"{self.url}/metrics answered HTTP {status}; retrying")
            return False
        try:
            scrape = parse_metrics(body.decode("utf-8", "replace"), time.perf_counter())
        except MetricsError as exc:
            self.set_status("garbage", f"{self.url}/metrics returned something else than metrics ({exc}); "
                                        "retrying")
            return False
        self._first_answer(scrape)
        facts = self._tracker.add(scrape)
        self.facts = facts
        self.publish(channel.ServerSample(facts))
        if elapsed > SLOW_S:
            self.set_status("slow", f"{self.name} answers slowly: /metrics took {elapsed:.1f} s")
        else:
            self.set_status("connected", f"attached to {self.name}")
        return True

    async def _fetch_models(self) -> bool | None:
        """/v1/models: the model id requests name and the context length where the server says it.
        False when the server is unreachable, None when it answered without a usable list."""
        try:
            status, body = await fetch(self._client, self.url + "/v1/models", max_bytes=MAX_MODELS_BYTES,
                                       total_s=self.timeout_s)
        except (httpx.HTTPError, ReadLimit) as exc:
            why = str(exc) if isinstance(exc, ReadLimit) else f"{self.url} is not answering ({type(exc).__name__})"
            self.set_status("down", f"{why}; retrying every {RETRY_S:.0f} s")
            return False
        try:
            data = json.loads(body)["data"][0]
            self.model_id = str(data["id"])[:200]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):
            if status == 401:
                self.set_status("down", f"{self.url} refused the API key (HTTP 401): attach with --api-key")
                return False
            return None
        self._owned_by = str(data.get("owned_by") or "")[:200]
        meta = data.get("meta")
        lengths = [(key, data.get(key)) for key in ("max_model_len", "context_length")]
        lengths.append(("meta.n_ctx_train", meta.get("n_ctx_train") if isinstance(meta, dict) else None))
        for key, value in lengths:
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_CONTEXT:
                self.publish(channel.Message(f"{self.url}/v1/models: {key} {str(value)[:40]!r} is not a context "
                                             "length; ignored"))
            elif self.max_model_len is None or key != "meta.n_ctx_train":
                self.max_model_len = value
        return True

    def _first_answer(self, scrape) -> None:
        """The first answer: the kind of server (metric prefixes, else /v1/models' owned_by)."""
        if self.answered:
            return
        self.kind = server_kind(scrape, self._owned_by) or "openai"
        self.name = f"{KIND_NAMES.get(self.kind, 'the server')} at {self.url}"
        self._tracker = FactsTracker(self.kind)
        self.on_first_answer(scrape is not None)
        self.answered = True  # after the window heard of it: a failure there is tried again next look

    def set_status(self, state: str, text: str) -> None:
        if state == "connected" and self.status[0] in ("down", "garbage"):
            text = f"reconnected: {text}"
        elif state == "connected" and self.status[0] == "connected":
            text = self.status[1]  # stays "reconnected: …" until the next change
        if self.status != (state, text):
            self.status = (state, text)
            self.publish(channel.ServerStatus(state, text))



def _said(exc: Exception) -> str:
    """An httpx error in one short line: its type and what it says (a TLS error names the mismatch)."""
    text = " ".join(str(exc).split())[:160]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
