"""llama.cpp's `llama-server` as the peer of `bench throughput` and `bench serve --peer llama-server`.

The server runs as a child process (ChildServer; the serving peer bench runs `inferlab serve` in one
too) on a free loopback port, started once per bench and stopped at the end; its log goes to a
temporary file, the tail of which is in any error. It gets the same threads as
the engine (`-t` and `-tb`) and `-np` parallel slots with continuous batching (its default); every slot
holds the longest request of the workload (no unified KV pool, so no request can run out of cache).

Offline throughput (`server_throughput`): every request is sent at once, as the token ids inferlab
gets (no tokenizer in between), with `max_tokens` fixed per request, `ignore_eos` and `cache_prompt:
false` (each round prefills in full, as inferlab's rounds start with a cold prefix cache). The replies
are not streamed: one response per request keeps the client's share of the 2 cores small. A request
that comes back short, or with another prompt length than was sent, is an error, not a figure.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from app.load.workload import BenchRequest
from app.managed.child import LLAMA_CPP_CRASH_RETRY, ChildServer, PeerError, crash_retry_note, free_port
from app.remote.bounded import fetch_json
from app.remote.client import request_body


def llama_server(binary: Path, gguf: Path, threads: int, parallel: int, ctx_per_slot: int,
                 extra: tuple[str, ...] = ()) -> ChildServer:
    """llama-server on `gguf`: `threads` for decode and batches, `parallel` slots of `ctx_per_slot` tokens
    each (no unified KV pool: no request can run out of cache), continuous batching (its default)."""
    port = free_port()
    return ChildServer("llama-server", [
        str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
        "-tb", str(threads), "-np", str(parallel), "-c", str(parallel * ctx_per_slot), "--no-kv-unified",
        "--metrics", *extra], port)


def enter_llama_server(stack, binary: Path, gguf: Path, threads: int, parallel: int,
                       ctx_per_slot: int) -> tuple[ChildServer, str | None]:
    """(llama_server(...) started inside `stack` (a contextlib.ExitStack), a note or None). One that dies of a
    signal while starting is started once more with LLAMA_CPP_CRASH_RETRY, and the note says so."""
    try:
        return stack.enter_context(llama_server(binary, gguf, threads, parallel, ctx_per_slot)), None
    except PeerError as exc:
        if not exc.signal:
            raise
        note = crash_retry_note("llama-server", exc.signal)
    return stack.enter_context(llama_server(binary, gguf, threads, parallel, ctx_per_slot, LLAMA_CPP_CRASH_RETRY)), note


def token_request(model: str, r: BenchRequest) -> tuple[str, dict]:
    """(path, body) of one non-streamed completion over the request's own token ids."""
    path, body = request_body(model, "", max_tokens=r.max_tokens, temperature=0.0, chat=False, ignore_eos=True)
    body.pop("stream_options")
    return path, {**body, "prompt": list(r.prompt_token_ids), "stream": False, "cache_prompt": False}


MAX_REPLY_BYTES = 4 * 2**20  # one completion's JSON (its text and usage)
REPLY_TOTAL_S = 3600.0


async def _post(client: httpx.AsyncClient, url: str, path: str, body: dict) -> dict:
    """One completion's JSON, read within MAX_REPLY_BYTES and REPLY_TOTAL_S (app/remote/bounded.py)."""
    try:
        reply = await fetch_json(client, url + path, what=path, method="POST", json=body, max_bytes=MAX_REPLY_BYTES,
                                 total_s=REPLY_TOTAL_S)
    except ValueError as exc:
        raise PeerError(str(exc)) from None
    if not isinstance(reply, dict):
        raise PeerError(f"{path} answered JSON that is not an object: {str(reply)[:120]!r}")
    return reply


def server_throughput(url: str, requests: list[BenchRequest], model: str = "peer") -> dict:
    """All requests at once to the server at `url`; output tokens/s from the first send to the last reply.
    PeerError when any request fails or does other work than asked (tokens out, prompt tokens in)."""

    async def main() -> tuple[list[dict], float]:
        limits = httpx.Limits(max_connections=len(requests) + 4)
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=3600.0), limits=limits) as client:
            t0 = time.perf_counter()
            replies = await asyncio.gather(*(_post(client, url, *token_request(model, r)) for r in requests))
            return list(replies), time.perf_counter() - t0

    replies, seconds = asyncio.run(main())
    usage = [reply.get("usage") or {} for reply in replies]
    wrong = [i for i, (u, r) in enumerate(zip(usage, requests))
             if u.get("completion_tokens") != r.max_tokens or u.get("prompt_tokens") != len(r.prompt_token_ids)]
    if wrong:
        i = wrong[0]
        raise PeerError(f"{len(wrong)} of {len(requests)} requests did other work than asked, e.g. #{i}: "
                           f"usage {usage[i]} for {len(requests[i].prompt_token_ids)} prompt tokens, "
                           f"{requests[i].max_tokens} out")
    produced = sum(u["completion_tokens"] for u in usage)
    return {"seconds": seconds, "output_tokens": produced, "output_tokens_per_s": produced / seconds,
            "prompt_tokens": sum(u["prompt_tokens"] for u in usage)}


def throughput_peer(model_path: str, requests: list[BenchRequest], threads: int, parallel: int,
                    stack) -> tuple[object | None, dict]:
    """(one measured run of `requests` through llama-server, what it runs) on the bf16 GGUF of the
    engine's weights, the server kept up by `stack` (a contextlib.ExitStack); (None, {"skipped": why})
    where llama.cpp is not built or the GGUF cannot be written."""
    from app.bench import llama_cpp

    binary = llama_cpp.find_binary("llama-server")
    if binary is None:
        return None, {"skipped": f"no llama-server under {llama_cpp.llama_cpp_dir()} (scripts/build_llama_cpp.sh)"}
    try:
        gguf = llama_cpp.bf16_gguf(model_path)
    except ValueError as exc:
        return None, {"skipped": str(exc)}
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in requests)
    server, note = enter_llama_server(stack, binary, gguf, threads, parallel, -(-longest // 256) * 256)
    server_throughput(server.url, requests[:parallel])  # warm-up: the file into the page cache, every slot once
    return (lambda: server_throughput(server.url, requests)), {
        "binary": str(binary), "build": llama_cpp.llama_cpp_build(), "gguf": str(gguf), "threads": threads,
        "parallel_slots": parallel,
        "command": " ".join(server.command), **({"note": note} if note else {}),
        "client": "all requests at once as token ids, max_tokens fixed, ignore_eos, cache_prompt false, "
                  "not streamed; tokens/s from the first send to the last reply (HTTP on loopback included)"}
