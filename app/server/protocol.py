"""Request bodies of the OpenAI API (the subset inferlab serves) and their SamplingParams.

Unknown fields are ignored, as the OpenAI API does for fields it does not know; fields inferlab knows
but cannot honour (n > 1, echo, penalties, logit_bias, tools, tool_choice, functions) and fields that
would be ignored here (top_logprobs without logprobs, a text part whose text is not a string, an empty
role) are refused with 400 rather than silently ignored. `top_k`, `ignore_eos`, `stop_token_ids` and
`priority` are vLLM-style extensions.

Types are strict (a string is not a number, a boolean is not an integer: what the API documents or a
400), text must be valid Unicode (no lone surrogates, which JSON's \ud800 escapes can carry), and list
sizes are capped (MAX_*), each with a 400 that names the field.
"""
from __future__ import annotations

from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, create_model, field_validator, model_validator

from app.server.errors import APIError, bad_request
from app.server.limits import lone_surrogate_at
from engine.sampling_params import REQUEST_DEFAULTS, REQUEST_FIELDS, SamplingParams

DEFAULT_COMPLETION_MAX_TOKENS = 16  # the OpenAI default for /v1/completions
MAX_PROMPTS = 256  # prompts (choices) in one completions request
MAX_STOP_STRINGS = 16  # OpenAI allows 4; vLLM more
MAX_STOP_CHARS = 1024  # per stop string (the detokenizer holds back this much text)
MAX_STOP_TOKEN_IDS = 256
MAX_MESSAGES = 1024


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = lone_surrogate_at(data)
        if where is not None:  # the message never repeats the text: it cannot be encoded either
            raise ValueError(f"text at {where} is not valid Unicode (a lone UTF-16 surrogate)")
        return data


def _request_field(name: str) -> tuple[Any, Any]:
    """(type, default) of a SamplingParams field in a request body: a flag is present or not (its default
    when absent, never null); any other field may be null or absent, meaning SamplingParams' default."""
    hint = get_type_hints(SamplingParams)[name]
    return (hint, REQUEST_DEFAULTS[name]) if hint is bool else (hint | None, None)


# temperature, top_p, top_k, seed, ignore_eos, ...: read from SamplingParams' own table, not spelled here
_SamplingFields = create_model("_SamplingFields", __base__=_Strict,
                               **{name: _request_field(name) for name in REQUEST_FIELDS})


class _Common(_SamplingFields):
    model: str | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    priority: int = 0
    user: str | None = None

    def refuse_unsupported(self) -> None:
        if self.n != 1:
            raise APIError(400, "only n=1 is supported", param="n")
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stop):
            raise APIError(400, f"stop takes at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} "
                                "characters", param="stop")
        if len(self.stop_token_ids or ()) > MAX_STOP_TOKEN_IDS:
            raise APIError(400, f"stop_token_ids takes at most {MAX_STOP_TOKEN_IDS} ids", param="stop_token_ids")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise APIError(400, f"{name} is not supported", param=name)
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        kwargs: dict[str, Any] = dict(max_tokens=max_tokens, stop=stop, stop_token_ids=list(self.stop_token_ids or []),
                                      logprobs=logprobs)
        kwargs.update({name: getattr(self, name) for name in REQUEST_FIELDS if getattr(self, name) is not None})
        try:
            return SamplingParams(**kwargs)
        except (ValueError, TypeError) as exc:
            raise bad_request(exc) from None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = DEFAULT_COMPLETION_MAX_TOKENS
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """One entry per choice: a string or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError(400, "the prompt is empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        if len(p) > MAX_PROMPTS:
            raise APIError(400, f"at most {MAX_PROMPTS} prompts in one request, got {len(p)}", param="prompt")
        if all(isinstance(x, str) for x in p) or all(isinstance(x, list) for x in p):
            return list(p)
        raise APIError(400, "prompt must be a string, a list of strings, token ids or lists of token ids",
                       param="prompt")

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise APIError(400, "echo is not supported", param="echo")
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of is not supported", param="best_of")
        if self.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")

    def sampling_params(self) -> SamplingParams:
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if self.max_tokens is None else self.max_tokens
        return self.sampling(max_tokens, self.logprobs)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    @field_validator("role")
    @classmethod
    def _role_named(cls, role: str) -> str:
        if not role.strip():  # the template would render a turn nobody sent
            raise ValueError("a message's role must not be empty")
        return role

    def text(self) -> str:
        """The message's text; content parts other than text, or whose text is not a string, are refused."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise APIError(400, f"content parts of type {str(part.get('type'))[:40]!r} are not supported",
                               param="messages")
            if not isinstance(part.get("text"), str):
                raise APIError(400, "a text content part needs a string `text`", param="messages")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None  # present at all: refused (no tools are supported, so it could only be ignored)
    functions: Any = None  # the deprecated form of tools
    function_call: Any = None
    response_format: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if not self.messages:
            raise APIError(400, "messages must not be empty", param="messages")
        if len(self.messages) > MAX_MESSAGES:
            raise APIError(400, f"at most {MAX_MESSAGES} messages in one request", param="messages")
        if self.tools:
            raise APIError(400, "tools are not supported", param="tools")
        for name in ("tool_choice", "functions", "function_call"):
            if getattr(self, name) is not None:
                raise APIError(400, f"{name} is not supported (this server offers no tools)", param=name)
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise APIError(400, "only response_format type 'text' is supported", param="response_format")

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]

    def sampling_params(self, num_prompt_tokens: int, max_model_len: int) -> SamplingParams:
        """Without a limit the answer may fill the rest of the context (as the OpenAI API does)."""
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if limit is None:
            limit = max_model_len - num_prompt_tokens
            if limit < 1:
                raise bad_request(f"the prompt ({num_prompt_tokens} tokens) fills the context length of "
                                  f"{max_model_len} tokens", param="messages")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self.sampling(limit, logprobs)


