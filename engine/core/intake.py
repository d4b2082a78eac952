"""Request intake: turn a prompt and its sampling parameters into a validated Request, in the caller's
thread (tokenizing and checking there keeps the engine thread for forward passes)."""
from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.request import Request
from engine.sampling_params import SamplingParams


class RequestIntake:
    """Validates prompts against the model (vocabulary, context length) and hands out request ids and
    per-request seeds (from one seeded stream, so a run with the same config samples the same)."""

    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, seed: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self._ids = itertools.count()
        self._seed_rng = random.Random(seed)

    def next_id(self, prefix: str = "req-") -> str:
        return f"{prefix}{next(self._ids)}"

    def new_request(self, prompt: str | Sequence[int], params: SamplingParams | None,
                    request_id: str | None, priority: int) -> Request:
        """Raises ValueError for a bad request; nothing is drawn (id, seed) for one."""
        params = params or SamplingParams()
        params.validate()
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt) if prompt else []
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty")
        if any(t < 0 or t >= self.vocab_size for t in ids):
            raise ValueError(f"prompt token ids must lie in [0, {self.vocab_size})")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds the context "
                f"length of {self.max_model_len} tokens")
        rid = request_id if request_id is not None else self.next_id()
        req = Request(rid, ids, params, priority=priority)
        # its torch.Generator is made in the engine thread, when the request is drained
        req.seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(62)
        req.detokenizer = IncrementalDetokenizer(self.tokenizer, ids, params.stop)
        return req
