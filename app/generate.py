"""`inferlab generate`: stream one completion to stdout as the engine produces it."""
from __future__ import annotations

import sys
import time

from app.device_args import device_options
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.drive import drive
from engine.loading.loader import ModelLoadError


class StderrProgress:
    """Loading progress on stderr, one line per phase updated in place; `close()` ends the open line so
    that what follows (the answer, the stats) starts on a line of its own."""

    def __init__(self) -> None:
        self._message: str | None = None

    def __call__(self, message: str, fraction: float) -> None:
        if self._message is not None and message != self._message:
            sys.stderr.write("\n")
        self._message = message
        sys.stderr.write(f"\r{message} {fraction * 100:5.1f}%")
        sys.stderr.flush()

    def close(self) -> None:
        if self._message is not None:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self._message = None


def stderr_progress(message: str, fraction: float) -> None:
    """One-shot progress lines (for callers that print nothing else on stderr meanwhile)."""
    sys.stderr.write(f"\r{message} {fraction * 100:5.1f}%" + ("\n" if fraction >= 1 else ""))
    sys.stderr.flush()


def chat_prompt(tokenizer, text: str, raw: bool, chat: bool) -> str:
    """The prompt the model sees: an instruct model answers its chat template, so that is the default
    where the model has one (`--raw` sends the text as it is; `--chat` insists on the template)."""
    if raw:
        return text
    if not tokenizer.has_chat_template:
        if chat:
            raise ValueError("this model has no chat template; drop --chat")
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}])


def run_generate(args) -> int:
    progress = StderrProgress()
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed, stop=args.stop)
        engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, **device_options(args),
                                        num_threads=args.threads), progress=progress)
        progress.close()
        prompt = chat_prompt(engine.tokenizer, args.prompt, args.raw, args.chat)
        t0 = time.perf_counter()
        # token ids (this thread also steps the engine): a prompt too long is refused here, before any step
        rid = engine.add_request(engine.tokenizer.encode(prompt) if prompt else prompt, params)
    except (ValueError, ModelLoadError) as exc:
        progress.close()
        print(f"inferlab: error: {exc}", file=sys.stderr)
        return 2
    first = None
    final = None

    def show(outputs) -> None:
        nonlocal first, final
        for out in outputs:
            if out.request_id != rid:
                continue
            if out.new_token_ids and first is None:
                first = time.perf_counter()
            sys.stdout.write(out.new_text)
            sys.stdout.flush()
            final = out

    drive(engine, on_outputs=show)
    sys.stdout.write("\n")
    sys.stdout.flush()
    failed = final is None or final.finish_reason == "error" or final.error is not None
    if args.stats and final is not None:
        dt = time.perf_counter() - t0
        n = len(final.token_ids)
        decode = (time.perf_counter() - first) / max(n - 1, 1) if first else 0.0
        ttft = f"{(first - t0) * 1e3:.0f} ms" if first else "none"  # (a request can fail before its first token)
        print(f"[{n} tokens, finish={final.finish_reason}, TTFT {ttft}, "
              f"{1 / decode if decode else 0:.1f} tok/s decode, {dt:.2f} s total]", file=sys.stderr)
        print(f"[engine: {engine.compute_line()}]", file=sys.stderr)
    if failed:  # one line and a non-zero exit: a script must not take a failed answer for an empty one
        why = (final.error or "no reason given") if final is not None else "the engine finished without an answer"
        print(f"inferlab: error: the request failed: {' '.join(str(why).split())[:300]}", file=sys.stderr)
        return 1
    return 0
