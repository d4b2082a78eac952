"""After a step: append sampled tokens, detokenize, check stop conditions, build RequestOutputs."""
from __future__ import annotations

import time

from engine.core.request import Request, RequestStatus
from engine.events import RequestOutput, RequestTimeline, TokenLogprob, TokenSource, new_request_output
from engine.token_ids import TokenIds

_DECODED = (TokenSource.DECODED,)


def append_token(req: Request, token: int, stop_ids: frozenset[int], max_model_len: int,
                 now: float | None = None) -> str:
    """Add one sampled token; returns the newly released text. Sets req.status when it finishes. `now`:
    when the token came (default: now; a step passes one time for all its tokens)."""
    now = time.perf_counter() if now is None else now
    if req.first_token_time is None:
        req.first_token_time = now
    req.last_token_time = now
    out = req.output_token_ids
    out.append(token)
    params, detok = req.sampling_params, req.detokenizer
    if token in params.stop_token_ids or (token in stop_ids and not params.ignore_eos):
        req.status = RequestStatus.FINISHED_STOPPED
        return detok.finish() if detok else ""
    text = detok.push((token,)) if detok else ""
    if detok is not None and detok.stopped:
        req.status = RequestStatus.FINISHED_STOPPED
    elif len(out) >= params.max_tokens or len(req.prompt_token_ids) + len(out) >= max_model_len:
        req.status = RequestStatus.FINISHED_LENGTH
        text += detok.finish() if detok else ""
    return text


def make_output(req: Request, new_ids: list[int], new_text: str,
                new_logprobs: list[tuple[float, list[tuple[int, float]]]] | None,
                id_to_piece, sources: list[TokenSource] | None = None) -> RequestOutput:
    """The request's RequestOutput for this step: its new tokens and text, and everything so far (a view, no copy).
    Every field given by position, in RequestOutput's field order (new_request_output: once a request a step)."""
    logprobs = None
    if new_logprobs is not None and req.sampling_params.logprobs is not None:
        logprobs = tuple(
            TokenLogprob(tok, lp, tuple((i, v, id_to_piece(i)) for i, v in alts))
            for tok, (lp, alts) in zip(new_ids, new_logprobs)
        )
    detok = req.detokenizer
    first, last, n = req.first_token_time, req.last_token_time, len(req.output_token_ids)
    reason = req.status.finish_reason
    k = len(new_ids)
    return new_request_output(
        req.request_id,  # request_id
        tuple(new_ids),  # new_token_ids
        new_text,  # new_text
        TokenIds(req.output_token_ids),  # token_ids: O(1), a view of the list, which only grows
        detok.text if detok else "",  # text
        reason is not None,  # finished
        reason,  # finish_reason
        tuple(sources) if sources is not None else _DECODED if k == 1 else (TokenSource.DECODED,) * k,  # sources
        logprobs,  # logprobs
        len(req.prompt_token_ids),  # num_prompt_tokens
        req.error,  # error
        detok.held_back_chars if detok else 0,  # held_back_chars
        tuple(id_to_piece(t) for t in new_ids) if k > 1 else (),  # new_token_pieces
        None if first is None else first - req.arrival_time,  # ttft_s
        (n - 1) / (last - first) if first is not None and n >= 2 and last > first else None,  # tokens_per_s
        req.lora_name,  # lora_name
    )


def timeline(req: Request) -> RequestTimeline:
    return RequestTimeline(
        request_id=req.request_id,
        arrival=req.arrival_time,
        num_prompt_tokens=req.num_prompt_tokens,
        first_scheduled=req.first_scheduled_time,
        first_token=req.first_token_time,
        finished=req.finished_time,
        num_output_tokens=req.num_output_tokens,
        num_preemptions=req.num_preemptions,
        num_cached_tokens=req.num_cached_tokens,
        finish_reason=req.status.finish_reason,
        lora_name=req.lora_name,
    )
