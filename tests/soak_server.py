"""Soak `inferlab serve` on the tiny test model (issue 12): N requests from concurrent clients, a share of
them bad (wrong types, out-of-range values, lone surrogates, oversized lists) and a share that disconnect
mid-stream; at the end the engine must hold 0 running, 0 waiting, 0 KV blocks, every good request must
have finished and no response may be a 5xx. Not collected by pytest (it runs for a minute or more):

    python tests/soak_server.py --requests 2000 --concurrency 16 --json soak.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BAD_FIELDS = [("temperature", "hot"), ("temperature", -1), ("top_p", 0), ("top_p", 1e-50), ("top_k", 2**70),
              ("seed", 2**64), ("seed", "7"), ("max_tokens", True), ("max_tokens", 0), ("stream", "yes"),
              ("prompt", "\ud800"), ("prompt", ["ok", "\udfff"]), ("stop", ["x"] * 500), ("n", 3),
              ("prompt", ["hi"] * 10_000), ("logprobs", 99), ("prompt", [10**9])]


def good_body(rng: random.Random) -> dict:
    words = ["the", "quick", "brown", "fox", "paged", "attention", "blocks", "decode", "hello", "world"]
    body = {"prompt": " ".join(rng.choices(words, k=rng.randint(1, 30))), "max_tokens": rng.randint(1, 16),
            "temperature": rng.choice([0, 0.7, 1.0]), "ignore_eos": True}
    if rng.random() < 0.3:
        body["seed"] = rng.randint(0, 2**32)
    return body


async def one(client: httpx.AsyncClient, url: str, rng: random.Random, tally: Counter) -> None:
    kind = rng.choices(["good", "bad", "disconnect"], weights=[70, 15, 15])[0]
    body = good_body(rng)
    if kind == "bad":
        field, value = rng.choice(BAD_FIELDS)
        body[field] = value
    stream = kind == "disconnect" or rng.random() < 0.3
    body["stream"] = body.get("stream", stream) if kind == "bad" else stream
    content = json.dumps(body)  # ensure_ascii: lone surrogates travel as \ud800 escapes
    headers = {"content-type": "application/json"}
    try:
        if kind == "disconnect":
            async with client.stream("POST", url + "/v1/completions", content=content, headers=headers) as r:
                async for _line in r.aiter_lines():
                    break  # go away after the first line
            tally["disconnected"] += 1
            return
        r = await client.post(url + "/v1/completions", content=content, headers=headers)
    except httpx.HTTPError as exc:
        tally[f"transport error {type(exc).__name__}"] += 1
        return
    if r.status_code >= 500:
        tally["5xx"] += 1
        print("5xx:", r.status_code, r.text[:200], body, file=sys.stderr)
    elif kind == "good":
        finished = r.status_code == 200 and ('"finish_reason":"length"' in r.text.replace(" ", "")
                                             or '"finish_reason":"stop"' in r.text.replace(" ", ""))
        tally["good finished" if finished else f"good NOT finished ({r.status_code})"] += 1
    else:
        tally[f"bad -> {r.status_code}"] += 1


async def soak(url: str, n: int, concurrency: int, seed: int) -> Counter:
    tally: Counter = Counter()
    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)

    async def guarded(client):
        async with sem:
            await one(client, url, rng, tally)

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(guarded(client) for _ in range(n)))
    return tally


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from conftest import build_tiny_model
    from server_helpers import serving, wait_until

    folder = build_tiny_model(Path(tempfile.mkdtemp(prefix="inferlab-soak-")) / "tiny")
    with serving(folder, max_num_seqs=8, max_queue_len=64, enable_prefix_caching=False) as (server, engine, aeng):
        t0 = time.perf_counter()
        tally = asyncio.run(soak(server.url, args.requests, args.concurrency, args.seed))
        wall = time.perf_counter() - t0
        wait_until(lambda: not engine.has_unfinished() and engine.block_manager.num_used_blocks == 0, 30)
        end = {"running": len(engine.scheduler.running), "waiting": len(engine.scheduler.waiting),
               "kv_blocks_used": engine.block_manager.num_used_blocks, "open_streams": aeng.num_open_streams()}
    result = {"requests": args.requests, "concurrency": args.concurrency, "wall_s": round(wall, 1),
              "outcomes": dict(sorted(tally.items())), "engine_at_end": end}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    ok = (tally["5xx"] == 0 and not any(k.startswith("good NOT") or k.startswith("transport") for k in tally)
          and not any(end.values()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
