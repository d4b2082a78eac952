"""`inferlab generate`: stream one completion to stdout as the engine produces it."""
from __future__ import annotations

import json
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


def chat_prompt(tokenizer, text: str, raw: bool, chat: bool, system: str | None = None) -> str:
    """The prompt the model sees: an instruct model answers its chat template, so that is the default
    where the model has one (`--raw` sends the text as it is; `--chat` insists on the template). `system`:
    a system message before it (only through the template)."""
    from app.generate_args import chat_messages

    if raw:
        if system:
            raise ValueError("--system goes through the chat template: drop --raw")
        return text
    if not tokenizer.has_chat_template:
        if chat or system:
            raise ValueError(f"this model has no chat template; drop {'--chat' if chat else '--system'}")
        return text
    return tokenizer.apply_chat_template(chat_messages(text, system))


def _engine(args, progress):
    """The engine of the flags: the knobs shared with `serve`, and one LoRA adapter slot for --lora."""
    from app.generate_args import find_lora, lora_choice
    from app.knob_args import knob_settings

    lora = lora_choice(getattr(args, "lora", None))
    extra = {"max_loras": 1} if lora else {}
    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, **device_options(args),
                                    num_threads=args.threads, **knob_settings(args), **extra), progress=progress)
    if lora:
        name, path = lora
        engine.add_lora(name, path or find_lora(str(engine.model_path), name))
    return engine, (lora[0] if lora else None)


def run_generate(args) -> int:
    from app.generate_args import read_prompt

    progress = StderrProgress()
    try:
        text = read_prompt(args)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed, stop=args.stop)
        engine, lora_name = _engine(args, progress)
        progress.close()
        prompt = chat_prompt(engine.tokenizer, text, args.raw, args.chat, getattr(args, "system", None))
        t0 = time.perf_counter()
        # token ids (this thread also steps the engine): a prompt too long is refused here, before any step
        rid = engine.add_request(engine.tokenizer.encode(prompt) if prompt else prompt, params, lora_name=lora_name)
    except (ValueError, ModelLoadError) as exc:
        progress.close()
        print(f"inferlab: error: {exc}", file=sys.stderr)
        return 2
    as_json = getattr(args, "json", False)
    first = None
    final = None

    def show(outputs) -> None:
        nonlocal first, final
        for out in outputs:
            if out.request_id != rid:
                continue
            if out.new_token_ids and first is None:
                first = time.perf_counter()
            if not as_json:
                sys.stdout.write(out.new_text)
                sys.stdout.flush()
            final = out

    drive(engine, on_outputs=show)
    t_end = time.perf_counter()
    n = len(final.token_ids) if final is not None else 0
    ttft_s = (first - t0) if first else None  # (a request can fail before its first token)
    decode = (t_end - first) / max(n - 1, 1) if first else 0.0
    failed = final is None or final.finish_reason == "error" or final.error is not None
    if as_json:
        print(json.dumps({"text": final.text if final else "", "token_ids": list(final.token_ids) if final else [],
                          "finish_reason": final.finish_reason if final else None, "prompt_tokens":
                          len(engine.tokenizer.encode(prompt)) if prompt else 0, "ttft_s": ttft_s,
                          "decode_tokens_per_s": (1 / decode) if decode else None, "total_s": t_end - t0,
                          "lora": lora_name, "engine": engine.compute_line(),
                          "error": final.error if final is not None else "no answer"}))
    else:
        sys.stdout.write("\n")
    sys.stdout.flush()
    if args.stats and final is not None:
        ttft = f"{ttft_s * 1e3:.0f} ms" if ttft_s is not None else "none"
        print(f"[{n} tokens, finish={final.finish_reason}, TTFT {ttft}, "
              f"{1 / decode if decode else 0:.1f} tok/s decode, {t_end - t0:.2f} s total]", file=sys.stderr)
        print(f"[engine: {engine.compute_line()}]", file=sys.stderr)
    if failed:  # one line and a non-zero exit: a script must not take a failed answer for an empty one
        why = (final.error or "no reason given") if final is not None else "the engine finished without an answer"
        print(f"inferlab: error: the request failed: {' '.join(str(why).split())[:300]}", file=sys.stderr)
        return 1
    return 0
