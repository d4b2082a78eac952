"""`inferlab bench serve --url URL`: the serving bench against any OpenAI-compatible server over HTTP.

Driver: app/remote/http_load.py (seeded Poisson arrivals, streaming /v1/completions, ignore_eos, latencies
from each request's due time, goodput under the SLO). The prompt tokens the server counted are in the
JSON (usage), per kind.
Run it against two servers one after the other with the same --seed for a side-by-side comparison.
"""
from __future__ import annotations

import asyncio

from app.load.kinds import PromptKind
from app.remote.http_load import LONG_WORDS, TimedText, client_for, make_text_schedule, run_rate, run_seed, warm_up
from engine.core.metrics import SLO


def add_url_args(p) -> None:
    p.add_argument("--url", default=None, metavar="URL",
                   help="bench an OpenAI-compatible server over HTTP (vLLM, SGLang, llama-server, inferlab serve) "
                        "instead of the in-process engine")
    p.add_argument("--api-key", default=None, help="with --url: the server's API key")
    p.add_argument("--served-model", default=None, help="with --url: the model id to ask for (default: /v1/models')")
    p.add_argument("--long-words", type=int, nargs=2, default=list(LONG_WORDS), help="with --url: long prompts, words")
    p.add_argument("--label", default=None, help="with --url: a name for this server in the JSON")


def run_url_bench(args) -> dict:
    from app.remote.source import base_url  # here, not at import: the bench parser stays light (httpx)

    url = base_url(args.url)
    slo = SLO(args.slo_ttft, args.slo_tpot, args.slo_percentile)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    schedules = {rate: make_text_schedule(args, rate, run_seed(args.seed, i)) for i, rate in enumerate(args.rates)}

    async def main() -> tuple[str, list[dict]]:
        async with client_for(args.num_requests, headers) as client:
            model = await warm_up(client, url, args.served_model)
            runs = [await run_rate(client, url, model, rate, schedules[rate], slo) for rate in args.rates]
            return model, runs

    model, runs = asyncio.run(main())
    some = next(iter(schedules.values()))
    return {
        "driver": "HTTP: streaming /v1/completions sent at their Poisson due time, ignore_eos; latency from the "
                  "due time, timed on arrival of each chunk (client side)",
        "server": {"url": url, "label": args.label, "model": model},
        "workload": url_workload(args, some),
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "percentile": slo.percentile},
        "runs": runs,
        "table": [r["row"] for r in runs],
    }


def url_workload(args, schedule: list[TimedText]) -> dict:
    return {"requests_per_run": args.num_requests, "long_share": args.long_share, "long_prompt_words": args.long_words,
            "chat_prompt_words": [12, 48], "chat_max_tokens": args.chat_max_tokens,
            "long_max_tokens": args.long_max_tokens, "rates_rps": args.rates, "seed": args.seed,
            "prompts": "fresh per rate and round (seed + 7919 x rate index + 104729 x round): no run hits a prefix "
                       "cache an earlier run filled",
            "long_requests": sum(r.kind == PromptKind.LONG for r in schedule)}


