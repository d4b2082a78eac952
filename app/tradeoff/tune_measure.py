"""What the tuning sweep measures on one running server, through its HTTP API and its process.

- load: the seeded HTTP load at each rate (app/remote/http_load.py), one warm-up request first.
- memory: the server process's resident memory (VmRSS, and its peak VmHWM, from /proc/PID/status:
  measured by the kernel) and the server's own /metrics families (gauges and counters, as it names them).
- greedy outputs: the held-out prompts at temperature 0 with `ignore_eos`, a fixed number of tokens each,
  not streamed, asking for one logprob per token so that the reply lists the generated tokens
  (OpenAI's `logprobs.tokens`, or llama.cpp's `logprobs.content[].token`); a server that does not
  list them is compared on its text, character by character (the result says which).
"""
from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from app.load.generator import corpus_text
from app.remote.bounded import ReadLimit, fetch, fetch_json
from app.remote.http_load import client_for, make_text_schedule, run_rate, run_seed, warm_up
from app.remote.metrics import MetricsError, parse_metrics
from engine.core.metrics import SLO

PROMPT_WORDS = 40  # each held-out prompt: the first words of one paragraph
MAX_METRIC_FAMILIES = 60
MAX_METRICS_BYTES = 4 * 2**20  # a /metrics page is tens of KiB; a larger one is not read on
METRICS_TOTAL_S = 10.0
MAX_REPLY_BYTES = 1 * 2**20  # a greedy reply of a few dozen tokens with their logprobs
GREEDY_TOTAL_S = 120.0
READY_POLL_S = 0.5  # between warm-up tries while a server that said healthy is not ready yet


@dataclass(frozen=True, slots=True)
class TuneLoad:
    """The load and the quality check of every point (the attribute names are http_load's)."""
    num_requests: int = 8
    rates: tuple[float, ...] = (2.0,)
    long_share: float = 0.0
    long_words: tuple[int, int] = (300, 480)
    chat_max_tokens: tuple[int, int] = (16, 32)
    long_max_tokens: tuple[int, int] = (16, 32)
    seed: int = 0
    quality_prompts: int = 4
    quality_tokens: int = 16
    # the highest rate's run this many times in all: a point's figures are the median run's, with the
    # spread of the runs beside them (a 2-core machine shared with others measured one point at 51 and 35
    # tok/s in two sweeps: one run says nothing of that)
    repeats: int = 1

    def as_dict(self) -> dict:
        return {"requests_per_rate": self.num_requests, "rates_rps": list(self.rates),
                "long_share": self.long_share, "long_prompt_words": list(self.long_words),
                "chat_prompt_words": [12, 48], "chat_max_tokens": list(self.chat_max_tokens),
                "long_max_tokens": list(self.long_max_tokens), "seed": self.seed,
                "quality_prompts": self.quality_prompts, "quality_tokens": self.quality_tokens,
                "repeats": self.repeats}


def heldout_prompts(count: int) -> list[str]:
    paragraphs = [p.split() for p in corpus_text().split("\n\n") if len(p.split()) >= 8]
    return [" ".join(words[:PROMPT_WORDS]) for words in paragraphs[:count]]


def process_memory(pid: int | None) -> dict:
    """{"rss_bytes", "rss_peak_bytes"} of a live process from /proc/PID/status (None where unreadable)."""
    out: dict = {"rss_bytes": None, "rss_peak_bytes": None}
    if pid is None:
        return out
    try:
        lines = open(f"/proc/{pid}/status").read().splitlines()
    except OSError:
        return out
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM") and value.strip().endswith("kB"):
            out["rss_bytes" if key == "VmRSS" else "rss_peak_bytes"] = int(value.split()[0]) * 1024
    return out


def server_metrics(url: str) -> dict:
    """The server's own /metrics gauges and counters by family name, or {"unavailable": why}. The body is
    read within MAX_METRICS_BYTES and METRICS_TOTAL_S; a value that is not a finite number (NaN, inf: a
    server that lies) is left out, so the result stays plain JSON."""
    async def scrape() -> tuple[int, bytes]:
        async with httpx.AsyncClient() as client:
            return await fetch(client, url + "/metrics", max_bytes=MAX_METRICS_BYTES, total_s=METRICS_TOTAL_S)

    try:
        status, body = asyncio.run(scrape())
    except (httpx.HTTPError, ReadLimit) as exc:
        return {"unavailable": f"{type(exc).__name__}: {exc}"[:200]}
    if status != 200:
        return {"unavailable": f"HTTP {status}"}
    try:
        scrape_ = parse_metrics(body.decode("utf-8", "replace"))
    except MetricsError as exc:
        return {"unavailable": str(exc)[:200]}
    facts = {name: value for name, value in {**scrape_.gauges, **scrape_.counters}.items()
             if isinstance(value, (int, float)) and math.isfinite(value)}
    return {name: facts[name] for name in sorted(facts)[:MAX_METRIC_FAMILIES]}


def draft_acceptance(metrics: dict) -> float | None:
    """Accepted / proposed draft tokens from the server's own counters (llama.cpp's and vLLM's families
    both end in spec_decode_num_accepted_tokens / spec_decode_num_draft_tokens); None where not exported
    or where the counters cannot be true (more accepted than proposed)."""
    accepted = next((v for k, v in metrics.items() if k.endswith("spec_decode_num_accepted_tokens")), None)
    drafted = next((v for k, v in metrics.items() if k.endswith("spec_decode_num_draft_tokens")), None)
    if not isinstance(accepted, (int, float)) or not isinstance(drafted, (int, float)) or drafted <= 0:
        return None
    share = accepted / drafted
    return share if 0.0 <= share <= 1.0 else None


def _reply_tokens(reply: dict) -> tuple[list[str], str]:
    """(the generated tokens, "tokens"), or the text's characters and "text" where none are listed."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        raise ValueError(f"a completion without choices: {str(reply)[:120]!r}")
    logprobs = choice.get("logprobs") if isinstance(choice.get("logprobs"), dict) else {}
    if isinstance(logprobs.get("tokens"), list):
        return [str(t) for t in logprobs["tokens"]], "tokens"
    if isinstance(logprobs.get("content"), list):
        return [str(c.get("token", "")) for c in logprobs["content"] if isinstance(c, dict)], "tokens"
    return list(str(choice.get("text") or "")), "text"


async def _greedy(client: httpx.AsyncClient, url: str, model: str, prompts: list[str],
                  max_tokens: int) -> list[tuple[list[str], str]]:
    async def one(prompt: str) -> tuple[list[str], str]:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "logprobs": 1, "stream": False}
        reply = await fetch_json(client, url + "/v1/completions", what="a greedy completion", method="POST",
                                 json=body, max_bytes=MAX_REPLY_BYTES, total_s=GREEDY_TOTAL_S)
        return _reply_tokens(reply)

    return [await one(p) for p in prompts]  # one at a time: each reply is the batch-of-one greedy output


def agreement(reference: list[tuple[list[str], str]], outputs: list[tuple[list[str], str]]) -> dict:
    """Position by position: the share of the reference's positions where this point produced the same
    token (or character); a position this point did not reach counts as a disagreement."""
    same = positions = 0
    units = {unit for _tokens, unit in reference + outputs}
    for (ref, _u), (cur, _v) in zip(reference, outputs):
        positions += len(ref)
        same += sum(a == b for a, b in zip(ref, cur))
    return {"agreement": same / positions if positions else None, "agreement_positions": positions,
            "agreement_unit": "tokens" if units == {"tokens"} else "text characters"}


async def ready(client: httpx.AsyncClient, url: str, ready_s: float,
                gone: Callable[[], str | None] = lambda: None) -> str:
    """The served model id once the server completes a warm-up request. A /health that says 200 before
    the model is loaded (or that flaps) is waited out for up to `ready_s`; then ValueError with the last
    answer. `gone()` says why waiting is pointless (the server exited, the sweep was cancelled): ValueError
    at once, not after `ready_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ready_s
    while True:
        try:
            return await warm_up(client, url, None, require_ok=True)
        except (httpx.HTTPError, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if (reason := gone()) is not None:
            raise ValueError(f"{reason} ({why})"[:300])
        if loop.time() >= deadline:
            raise ValueError(f"/health said 200 but no completion succeeded within {ready_s:g} s: {why}"[:300])
        await asyncio.sleep(READY_POLL_S)


def all_failed(runs: list[dict], num_requests: int) -> str | None:
    """Why the point has no figure when every request of its most loaded run failed (else None)."""
    last = runs[-1]
    if last["row"]["errors"] < num_requests:
        return None
    return f"every request at {last['rate_rps']} req/s failed, e.g. {(last['errors'] or ['?'])[0]}"[:300]


async def _measure(url: str, load: TuneLoad, slo: SLO, label: str, quality: bool, ready_s: float,
                   gone: Callable[[], str | None]) -> dict:
    schedules = {rate: make_text_schedule(load, rate, run_seed(load.seed, i)) for i, rate in enumerate(load.rates)}
    async with client_for(load.num_requests) as client:
        model = await ready(client, url, ready_s, gone)
        runs = [await run_rate(client, url, model, rate, schedules[rate], slo, label) for rate in load.rates]
        failed = all_failed(runs, load.num_requests)
        if failed:
            raise ValueError(failed)
        top = load.rates[-1]
        repeats = [await run_rate(client, url, model, top, schedules[top], slo, label)
                   for _ in range(load.repeats - 1)]
        greedy = (await _greedy(client, url, model, heldout_prompts(load.quality_prompts), load.quality_tokens)
                  if quality else [])
    return {"served_model": model, "runs": runs, "repeats": repeats, "greedy": greedy}


def measure_server(url: str, load: TuneLoad, slo: SLO, label: str = "", quality: bool = True,
                   ready_s: float = 60.0, gone: Callable[[], str | None] = lambda: None) -> dict:
    """{"served_model", "runs" (one per rate), "repeats" (the highest rate's further runs), "greedy" (tokens
    per held-out prompt)}; httpx errors and
    ValueError propagate (the sweep records the point as failed), as does a run where every request failed.
    `gone()`: why the server cannot answer any more (see `ready`), else None."""
    return asyncio.run(_measure(url, load, slo, label, quality, ready_s, gone))


def _run_figures(run: dict) -> tuple[float | None, float]:
    tpot = run["report"]["tpot"]["p50"]
    return (1.0 / tpot if tpot else None), run["row"]["output_tokens_per_s"]


def headline(runs: list[dict], price_per_hour: float, repeats: list[dict] = ()) -> dict:
    """The point's figures from its most loaded run (the highest rate): per user = 1 / p50 TPOT (the
    report's unrounded latencies; the rows printed per rate are rounded to the millisecond). With
    `repeats` (further runs at that rate) the run whose total tokens/s is the median of them all gives the
    figures, and "spread" the least and the most of the runs' per-user and total tokens/s and $/1M tokens."""
    tries = [runs[-1], *repeats]
    median = sorted(tries, key=lambda run: run["row"]["output_tokens_per_s"] or 0.0)[(len(tries) - 1) // 2]
    row, report = median["row"], median["report"]
    per_user, total = _run_figures(median)
    ms = lambda s: None if s is None else round(1e3 * s, 3)  # noqa: E731
    cost = lambda t: price_per_hour / (t * 3600.0) * 1e6 if t else None  # noqa: E731
    out = {"tokens_per_s_user": per_user, "tokens_per_s_total": total, "usd_per_mtok": cost(total),
           "p50_ttft_ms": ms(report["ttft"]["p50"]), "p99_ttft_ms": ms(report["ttft"]["p99"]),
           "p50_tpot_ms": ms(report["tpot"]["p50"]), "p99_tpot_ms": ms(report["tpot"]["p99"]),
           "goodput_rps": row["goodput_rps"], "slo_attainment": row["slo_attainment"], "repeats": len(tries)}
    users = [u for u, _t in map(_run_figures, tries) if u is not None]
    totals = [t for _u, t in map(_run_figures, tries) if t]
    if len(tries) > 1 and users and totals:
        out["spread"] = {"tokens_per_s_user": [min(users), max(users)],
                         "tokens_per_s_total": [min(totals), max(totals)],
                         "usd_per_mtok": [cost(max(totals)), cost(min(totals))]}
    return out
