"""The seeded HTTP load at one rate against any OpenAI-compatible server, timed on arrival (client side).

Driver: an asyncio client sends streaming /v1/completions at seeded Poisson due times (short "chat"
prompts mixed with long ones, words of the held-out text: this side has no tokenizer of the server's)
with `ignore_eos`, so every server does the same work per request; each request is timed on arrival
(app/remote/client.py): TTFT from the due time to the first content chunk, TPOT from the first to the
last over the output tokens the server's `usage` reports. Goodput is the requests/s that met both SLO
targets. Used by `inferlab bench serve --url` (app/bench/serve_url.py), its llama-server peer and the
tuning sweep on managed servers (app/tradeoff/tune.py).
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from dataclasses import dataclass

import httpx

from app.load.generator import corpus_text
from app.load.kinds import PromptKind
from app.remote.bounded import ReadLimit, fetch
from app.remote.client import StreamResult, request_body, stream_request
from engine.core.metrics import SLO, latency_report, percentile, request_timings
from engine.events import RequestTimeline

LONG_WORDS = (300, 480)  # default long prompts, in words (~400-640 tokens)


@dataclass(frozen=True, slots=True)
class TimedText:
    due_s: float
    prompt: str
    max_tokens: int
    kind: PromptKind


def run_seed(seed: int, rate_index: int, round_index: int = 0) -> int:
    """The schedule seed of one run: each rate and round gets prompts of its own, so no run is served from
    the prefix cache (inferlab's, llama-server's cache_prompt) that an earlier run of the same texts filled.
    Within a run every server gets the same schedule (the side-by-side comparison)."""
    return seed + 7919 * rate_index + 104729 * round_index


def make_text_schedule(args, rate: float, seed: int) -> list[TimedText]:
    rng = random.Random(seed)
    words = corpus_text().split()
    out, t = [], 0.0
    for _ in range(args.num_requests):
        t += rng.expovariate(rate)
        long = rng.random() < args.long_share
        n = rng.randint(*args.long_words) if long else rng.randint(12, 48)
        start = rng.randrange(0, max(1, len(words) - n))
        max_tokens = rng.randint(*(args.long_max_tokens if long else args.chat_max_tokens))
        kind = PromptKind.LONG if long else PromptKind.CHAT
        out.append(TimedText(t, " ".join(words[start:start + n]), max_tokens, kind))
    return out


MAX_MODELS_BYTES = 1 * 2**20  # /v1/models lists a few models


async def _model_id(client: httpx.AsyncClient, url: str) -> str:
    """The first model /v1/models lists; ValueError (saying what came) for anything else."""
    try:
        status, body = await fetch(client, url + "/v1/models", max_bytes=MAX_MODELS_BYTES, total_s=30.0)
    except ReadLimit as exc:
        raise ValueError(f"/v1/models: {exc}") from None
    if status != 200:
        raise ValueError(f"/v1/models answered HTTP {status}: {body[:120].decode('utf-8', 'replace')!r}")
    try:
        model = json.loads(body)["data"][0]["id"]
    except (ValueError, LookupError, TypeError, RecursionError):
        raise ValueError(f"/v1/models did not list a model: {body[:120].decode('utf-8', 'replace')!r}") from None
    if not isinstance(model, str) or not model:
        raise ValueError(f"/v1/models listed a model id that is not a name: {str(model)[:80]!r}")
    return model


async def _run_rate(client, url: str, model: str, schedule: list[TimedText]) -> tuple[list[StreamResult], float]:
    t0 = time.perf_counter()

    async def one(i: int, r: TimedText) -> StreamResult:
        await asyncio.sleep(max(0.0, t0 + r.due_s - time.perf_counter()))
        path, body = request_body(model, r.prompt, max_tokens=r.max_tokens, temperature=0.0, chat=False,
                                  seed=i, ignore_eos=True)
        res = StreamResult(f"serve-{i}")
        await stream_request(client, url, path, body, res)
        res.sent = t0 + r.due_s  # latency from the due time, as the in-process bench measures it
        if res.error is None and (res.completion_tokens or 0) > r.max_tokens:  # it would inflate tokens/s
            res.finish_reason = "error"
            res.error = f"usage says {res.completion_tokens} completion tokens for max_tokens {r.max_tokens}"
        return res

    results = await asyncio.gather(*(one(i, r) for i, r in enumerate(schedule)))
    return list(results), t0


def client_for(num_requests: int, headers: dict | None = None) -> httpx.AsyncClient:
    """One client for a whole run: a connection per request in flight."""
    return httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=600.0), headers=headers or {},
                             limits=httpx.Limits(max_connections=num_requests + 4))


async def warm_up(client: httpx.AsyncClient, url: str, model: str | None, *, require_ok: bool = False) -> str:
    """The served model id (`model` when given); one short request first, as the first request pays for
    lazy setup on some servers. `require_ok`: ValueError with the server's answer when that request fails."""
    model = model or await _model_id(client, url)
    res = StreamResult("warmup")
    await stream_request(client, url, *request_body(model, "Hello", max_tokens=4, temperature=0.0, chat=False), res)
    if require_ok and res.error is not None:
        raise ValueError(f"the warm-up request failed: {res.error}")
    return model


async def run_rate(client: httpx.AsyncClient, url: str, model: str, rate: float, schedule: list[TimedText],
                   slo: SLO, label: str | None = None) -> dict:
    """One run of `schedule` against the server at `url`: its report, its row printed on stderr."""
    results, t0 = await _run_rate(client, url, model, schedule)
    run = _report(rate, results, t0, slo, schedule)
    _print_row(run, label)
    return run


def _timeline(res: StreamResult) -> RequestTimeline:
    return RequestTimeline(res.request_id, res.sent, res.prompt_tokens or 0, first_token=res.first_token,
                           finished=res.finished, num_output_tokens=res.num_tokens,
                           finish_reason=res.finish_reason if res.error is None else "error")


def _report(rate: float, results: list[StreamResult], t0: float, slo: SLO, schedule: list[TimedText]) -> dict:
    timings = [request_timings(_timeline(r)) for r in results]
    end = max((r.finished or t0) for r in results)
    report = latency_report(timings, end - t0, slo).as_dict()
    out_tokens = sum(r.num_tokens for r in results if r.error is None)
    kinds = {f"serve-{i}": r.kind for i, r in enumerate(schedule)}
    prompt_tokens = {k: [r.prompt_tokens for r in results if kinds[r.request_id] == k and r.prompt_tokens]
                     for k in PromptKind}
    errors = [r.error for r in results if r.error]
    row = {"rate_rps": rate, "goodput_rps": round(report["goodput_rps"], 3),
           "slo_attainment": round(report["slo_attainment"], 3),
           "p50_ttft_s": _r(report["ttft"]["p50"]), "p99_ttft_s": _r(report["ttft"]["p99"]),
           "p50_tpot_s": _r(report["tpot"]["p50"]), "p99_tpot_s": _r(report["tpot"]["p99"]),
           "output_tokens_per_s": round(out_tokens / (end - t0), 2) if end > t0 else None,
           "duration_s": round(end - t0, 1), "errors": len(errors), "load_1m": round(os.getloadavg()[0], 2)}
    return {"rate_rps": rate, "report": report, "row": row, "errors": errors[:5],
            "mean_prompt_tokens": {k: (sum(v) / len(v) if v else None) for k, v in prompt_tokens.items()},
            "p50_inter_token_s": percentile([x for r in results for x in r.inter_token_s()], 50)}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _print_row(run: dict, label: str | None = None) -> None:
    r = run["row"]
    print(f"{label + '  ' if label else ''}rate {r['rate_rps']:>4} rps  "
          f"goodput {r['goodput_rps']:.2f} rps ({r['slo_attainment']:.0%})  "
          f"TTFT p50 {r['p50_ttft_s']} p99 {r['p99_ttft_s']} s  TPOT p50 {r['p50_tpot_s']} p99 {r['p99_tpot_s']} s  "
          f"{r['output_tokens_per_s']} tok/s  [{r['duration_s']} s, {r['errors']} errors, load {r['load_1m']}]",
          file=sys.stderr, flush=True)
