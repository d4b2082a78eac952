"""The app host's multi-LoRA work, in the engine thread: register the adapters a preset mixes, give the
load generator instruction prompts, and send one prompt to every adapter at once (app/host/engine_host.py)."""
from __future__ import annotations

import time
from dataclasses import replace

from app.host import host_commands as cmd
from app.source import channel
from engine.lora.shipped import SHIPPED, available_adapters
from engine.sampling_params import SamplingParams

LIVE_PROMPTS_FROM = 64  # train-lora learns from the first 64 instructions: the live load asks the others


def instruction_prompts(engine) -> list[list[int]]:
    """Held-out instructions (assets/mtp_prompts.txt past the ones adapters train on), chat-formatted."""
    from engine.spec.mtp_train import default_prompts

    tok = engine.tokenizer
    texts = default_prompts()[LIVE_PROMPTS_FROM:] or default_prompts()
    if tok.has_chat_template:
        texts = [tok.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
    return [tok.encode(t) for t in texts]


def adapter_rows(engine) -> tuple[dict, ...]:
    return tuple({"name": i.name, "rank": i.rank, "targets": i.targets, "nbytes": i.nbytes,
                  "source": "shipped" if str(SHIPPED) in i.path else i.path} for i in engine.list_loras())


def use_loras(host, c: cmd.UseLoras) -> None:
    """Register every adapter of the mix not registered yet; the load generator mixes those found."""
    engine = host.engine
    wanted = [n for n in dict.fromkeys(c.mix) if n != "base"]
    if wanted and engine.lora is None:
        host.publish(channel.Message("this engine has no LoRA pool (max_loras = 0): every request runs on the "
                                     "base model"))
        wanted = []
    found = available_adapters(str(engine.model_path))
    have = {i.name for i in engine.list_loras()}
    missing = []
    for name in wanted:
        if name in have:
            continue
        if name not in found:
            missing.append(name)
            continue
        try:
            engine.add_lora(name, str(found[name]))
        except ValueError as exc:  # made for another base model, rank too high, …: say so, run without it
            host.publish(channel.Message(f"adapter {name} refused: {exc}"))
            missing.append(name)
    if missing:
        host.publish(channel.Message(
            f"adapter(s) {', '.join(missing)} not found for this model: train one with "
            "`inferlab train-lora --style NAME` (a few minutes); the others run"))
    mix = tuple(n for n in c.mix if n == "base" or n not in missing) if wanted else ()
    host.loadgen.set_config(replace(host.loadgen.config, lora_mix=mix), time.perf_counter())
    host.publish(channel.LoraAdapters(adapter_rows(engine)))


def ask_every_adapter(host, c: cmd.AskEveryAdapter) -> None:
    engine = host.engine
    names = [None, *(i.name for i in engine.list_loras())]
    params = SamplingParams(max_tokens=c.max_tokens, temperature=0.0)
    assignments = {}
    for name in names:
        try:
            rid = engine.add_request(c.prompt, params, lora_name=name, chat=c.chat)
        except ValueError as exc:
            host.publish(channel.Message(f"side-by-side request for {name or 'base'} refused: {exc}"))
            continue
        assignments[rid] = name
    host.publish(channel.SideBySide(assignments, c.prompt))
