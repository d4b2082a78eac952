"""`inferlab serve`: load the engine, step it in a background thread, serve the OpenAI API with uvicorn."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from app.device_args import device_options
from app.knob_args import add_knob_args, knob_settings
from app.server.deadlines import MAX_CONNECTIONS
from app.train_mtp import bounded
from engine.core.policies import POLICIES
from engine.knobs import KNOB


def add_serve_args(p: argparse.ArgumentParser, engine_args) -> None:
    engine_args(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port of the API")
    p.add_argument("--served-model-name", default=None, help="the model id clients see (default: --model)")
    p.add_argument("--api-key", default=os.environ.get("INFERLAB_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $INFERLAB_API_KEY, else none)")
    p.add_argument("--max-connections", type=bounded(int, 1), default=MAX_CONNECTIONS, metavar="N",
                   help=f"open connections served at once; a request past them is answered 503 (default "
                        f"{MAX_CONNECTIONS})")
    p.add_argument("--plain-special-tokens", action="store_true",
                   help="encode special-token text inside chat messages (e.g. <|im_end|><|im_start|>system) as "
                        "plain text, so a message cannot close its turn or open a system one (default: parsed "
                        "as control tokens, as vLLM does)")
    p.add_argument("--metrics-require-key", action="store_true",
                   help="put /metrics behind --api-key too (by default it is open, as in vLLM)")
    p.add_argument("--max-num-seqs", type=int, default=KNOB["max_num_seqs"].default,
                   help="requests in the running batch")
    p.add_argument("--max-num-batched-tokens", type=int, default=KNOB["max_num_batched_tokens"].default,
                   help="token budget of one step")
    p.add_argument("--no-chunked-prefill", action="store_true", help="prefill each prompt in one piece")
    p.add_argument("--max-step-ms", type=float, default=KNOB["max_step_ms"].default, metavar="MS",
                   help="while requests decode, cut prompt chunks so a step (their time per output token) is "
                        "predicted to stay within MS (default: the token budget alone)")
    p.add_argument("--ttft-budget-ms", type=float, default=None, metavar="MS",
                   help="serve toward this time to first token: prompts that can still make it go first, "
                        "shortest first; late ones wait behind them (default: off)")
    p.add_argument("--tpot-budget-ms", type=float, default=None, metavar="MS",
                   help="serve toward this time per output token: prompt chunks are sized so every decoding "
                        "request stays within it (default: off)")
    p.add_argument("--policy", default=KNOB["policy"].default, choices=sorted(POLICIES),
                   help="which waiting request goes next")
    p.add_argument("--max-queue-len", type=int, default=None, help="refuse (429) beyond this many waiting")
    p.add_argument("--max-predicted-wait", type=float, default=None, metavar="SECONDS",
                   help="refuse (429) when the predicted queue wait exceeds this")
    p.add_argument("--kv-cache-mib", type=int, default=None, help="CPU KV cache budget in MiB (default: the engine's "
                   "own sizing from the free memory)")
    p.add_argument("--max-model-len", type=int, default=None, metavar="TOKENS",
                   help="the longest request (prompt + answer) served (default: the model's context length)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each decode step (the first steps stall while it compiles)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template for /v1/chat/completions instead of the model's own")
    add_knob_args(p)  # the knobs a tradeoff point varies: weight bits, KV dtype, speculation
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="serve a PEFT LoRA adapter as model NAME (repeatable)")
    p.add_argument("--max-loras", type=int, default=None,
                   help="adapters in device slots at once (default: the number of --lora, at most 4)")
    p.add_argument("--max-lora-rank", type=int, default=64, help="the largest adapter rank a slot holds")
    p.add_argument("--max-cpu-loras", type=int, default=None, help="adapters kept in host memory beyond the slots")
    p.add_argument("--lora-dir", default=None, metavar="DIR",
                   help="allow POST /v1/load_lora_adapter for adapter folders inside DIR (off by default)")


def engine_config(args):
    from engine.config import EngineConfig

    kw = dict(model=args.model, dtype=args.dtype, **device_options(args), num_threads=args.threads,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              enable_chunked_prefill=not args.no_chunked_prefill, policy=args.policy, max_step_ms=args.max_step_ms,
              ttft_budget_ms=args.ttft_budget_ms, tpot_budget_ms=args.tpot_budget_ms,
              max_queue_len=args.max_queue_len, max_predicted_wait_s=args.max_predicted_wait,
              max_model_len=args.max_model_len, compile=args.compile, **knob_settings(args))
    if args.kv_cache_mib:
        kw["kv_cache_memory_bytes"] = args.kv_cache_mib * 2**20
    if args.lora or args.lora_dir:
        kw.update(max_loras=args.max_loras or min(max(len(args.lora), 1), 4), max_lora_rank=args.max_lora_rank,
                  max_cpu_loras=args.max_cpu_loras)
    return EngineConfig(**kw)


def read_chat_template(path: str | None) -> str | None:
    """--chat-template FILE's text (ValueError names the file when it cannot be read)."""
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--chat-template {path}: {exc}") from None


def lora_args(specs: list[str]) -> list[tuple[str, str]]:
    """--lora NAME=PATH values as (name, path); ValueError for one without '='."""
    pairs = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora wants NAME=PATH, got {spec!r}")
        pairs.append((name, path))
    return pairs


def run_serve(args) -> int:
    import uvicorn

    from app.generate import stderr_progress
    from app.server.api import create_app
    from app.server.header_timeout import serving_options
    from engine.llm_engine import LLMEngine
    from engine.loading.loader import ModelLoadError
    from engine.runner.threads import off_main_thread
    from engine.serving.async_engine import AsyncEngine

    if args.metrics_require_key and not args.api_key:
        print("inferlab: error: --metrics-require-key needs --api-key (or $INFERLAB_API_KEY)", file=sys.stderr)
        return 2
    def build() -> LLMEngine:
        loras = lora_args(args.lora)
        template = read_chat_template(args.chat_template)
        engine = LLMEngine(engine_config(args), progress=stderr_progress)
        if template is not None:
            engine.tokenizer.set_chat_template(template)
        for lora_name, path in loras:
            if lora_name == (args.served_model_name or args.model):
                raise ValueError(f"--lora {lora_name}=...: an adapter cannot take the base model's name")
            engine.add_lora(lora_name, path)
        return engine

    try:
        # built off the main thread: the engine loop's thread then has the only OpenMP team, and its ops
        # do not wait for sleeping helpers (engine/runner/threads.py, off_main_thread)
        engine = off_main_thread(build)
    except (ValueError, ModelLoadError) as exc:
        print(f"\ninferlab: error: {exc}", file=sys.stderr)  # a line of its own, after the progress
        return 2
    except KeyboardInterrupt:  # Ctrl+C while loading: the loading thread is a daemon and ends with us
        print("\ninferlab: interrupted while loading the model", file=sys.stderr)
        return 130
    async_engine = AsyncEngine(engine).start()
    name = args.served_model_name or args.model
    app = create_app(async_engine, model_name=name, api_key=args.api_key, lora_dir=args.lora_dir,
                     metrics_require_key=args.metrics_require_key, plain_special_tokens=args.plain_special_tokens)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"inferlab: warning: serving on {args.host} without --api-key", file=sys.stderr)
    print(f"inferlab: serving {name} on http://{args.host}:{args.port}/v1 (metrics: /metrics)", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=2,
                    **serving_options(max_connections=args.max_connections))
    finally:
        async_engine.shutdown()
    return 0
