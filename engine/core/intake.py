"""Request intake: hand out request ids in the caller's thread; turn a queued AddRequest into a Request in the
engine thread (tokenizing, the chat template, the detokenizer: the heavy part never runs where the request
came from, e.g. the GUI thread)."""
from __future__ import annotations

import itertools
import random

from engine.commands import AddRequest
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.request import Request
from engine.validation import RequestLimits, check_request


class RequestIntake:
    """Checks prompts against the model (vocabulary, context length) and hands out request ids and
    per-request seeds (from one seeded stream, in the order requests are drained, so a run with the same
    config samples the same)."""

    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, seed: int) -> None:
        self.tokenizer = tokenizer
        self.limits = RequestLimits(vocab_size, max_model_len)
        self._ids = itertools.count()
        self._seed_rng = random.Random(seed)

    def next_id(self, prefix: str = "req-") -> str:
        return f"{prefix}{next(self._ids)}"

    def build(self, command: AddRequest) -> Request:
        """The Request of a queued AddRequest (engine thread). Raises ValueError when the tokenized prompt
        does not fit (nothing, no seed, is drawn for it); `failed_request` then stands in for it."""
        ids = self.prompt_ids(command)
        check_request(ids, command.params, self.limits)  # a text prompt's length is known only now
        req = self._request(command, ids)
        # its torch.Generator is made by the engine, on the device, when it takes the request
        req.seed = command.params.seed if command.params.seed is not None else self._seed_rng.getrandbits(62)
        req.detokenizer = IncrementalDetokenizer(self.tokenizer, ids, command.params.stop)
        return req

    def prompt_ids(self, command: AddRequest) -> list[int]:
        if not isinstance(command.prompt, str):
            return list(command.prompt)
        text = command.prompt
        if command.chat and self.tokenizer.has_chat_template:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        return self.tokenizer.encode(text) if text else []

    def failed_request(self, command: AddRequest) -> Request:
        """A stand-in for a request that could not be built, so that it finishes with an error output."""
        prompt = [] if isinstance(command.prompt, str) else list(command.prompt)
        return self._request(command, prompt)

    @staticmethod
    def _request(command: AddRequest, ids: list[int]) -> Request:
        req = Request(command.request_id, ids, command.params, arrival_time=command.arrival_time,
                      priority=command.priority)
        req.lora_name, req.lora_id = command.lora_name, command.lora_id
        return req
