"""The HTTP layer against hostile input (issue 12, points 3, 4, 7, 8): text that is not valid Unicode,
sizes beyond the caps, wrong JSON types and prompt lists the queue can never hold are OpenAI-style 400s
that leave nothing running; tokenizing happens off the event loop; names never leak a local path;
/metrics can sit behind the key; /openapi.json is published; and a few hundred generated requests, good
and bad, get no 5xx while every good one finishes and the engine ends empty."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import MODEL_NAME, serving, wait_until

from app.server import ServerThread, create_app
from app.server.protocol import MAX_PROMPTS, MAX_STOP_CHARS, MAX_STOP_STRINGS

QUEUE = 6


@pytest.fixture(scope="module")
def stack(tiny_llama):
    with serving(tiny_llama, max_queue_len=QUEUE, max_num_seqs=4, enable_prefix_caching=False) as s:
        yield s


@pytest.fixture(scope="module")
def url(stack):
    return stack[0].url


def post(url: str, path: str, body: dict | str, **kw) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)  # ensure_ascii: surrogates as \ud800
    return httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=60, **kw)


def error_of(r: httpx.Response) -> dict:
    assert r.headers["content-type"].startswith("application/json"), r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def idle(stack) -> bool:
    engine = stack[1]
    return (not engine.scheduler.running and not engine.scheduler.waiting and not engine.has_unfinished()
            and engine.block_manager.num_used_blocks == 0 and stack[2].num_open_streams() == 0)


SURROGATES = ["\ud800", "a\udfffb", "ok \udc80", "\ud83d"]  # lone halves (a pair would be valid)


@pytest.mark.parametrize("text", SURROGATES)
@pytest.mark.parametrize("where", ["prompt", "prompt-list", "stop", "chat", "chat-part"])
def test_text_that_is_not_unicode_is_a_400(url, stack, text, where):
    path, body = "/v1/completions", {"prompt": "Hello", "max_tokens": 2}
    if where == "prompt":
        body["prompt"] = text
    elif where == "prompt-list":
        body["prompt"] = ["Hello there", "fine", text]
    elif where == "stop":
        body["stop"] = [text]
    else:
        path = "/v1/chat/completions"
        content = text if where == "chat" else [{"type": "text", "text": text}]
        body = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": content}],
                "max_tokens": 2}
    r = post(url, path, body)
    assert r.status_code == 400, r.text
    assert "not valid Unicode" in error_of(r)["message"]
    assert wait_until(lambda: idle(stack), 5)  # the good prompts of the list are not left running


def test_tokenizing_runs_off_the_event_loop(url, stack, monkeypatch):
    cls = type(stack[2].tokenizer)
    real_encode, real_template = cls.encode, cls.apply_chat_template
    on_loop = []

    def loop_running() -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            return False

    def encode(self, *a, **k):
        on_loop.append(loop_running())
        return real_encode(self, *a, **k)

    def template(self, *a, **k):
        on_loop.append(loop_running())
        return real_template(self, *a, **k)

    monkeypatch.setattr(cls, "encode", encode)
    monkeypatch.setattr(cls, "apply_chat_template", template)
    assert post(url, "/v1/completions", {"prompt": ["Hello", "world"], "max_tokens": 2}).status_code == 200
    assert post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                              "max_tokens": 2}).status_code == 200
    assert len(on_loop) >= 4 and not any(on_loop)


@pytest.mark.parametrize("body, needle", [
    ({"prompt": ["a"] * (MAX_PROMPTS + 1)}, "prompts"),
    ({"prompt": "Hi", "stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop"),
    ({"prompt": "Hi", "stop": "y" * (MAX_STOP_CHARS + 1)}, "stop"),
    ({"prompt": "Hi", "stop_token_ids": list(range(10_000))}, "stop_token_ids"),
])
def test_sizes_beyond_the_caps_are_400(url, body, needle):
    r = post(url, "/v1/completions", {**body, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert needle in error_of(r)["message"]


def test_a_body_beyond_the_cap_is_400(url):
    from app.server.limits import MAX_BODY_BYTES

    r = post(url, "/v1/completions", {"prompt": "x" * (MAX_BODY_BYTES + 10), "max_tokens": 1})
    assert r.status_code == 400 and "body" in error_of(r)["message"]
    assert post(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}).status_code == 200


def test_more_prompts_than_the_queue_is_400_not_429(url, stack):
    r = post(url, "/v1/completions", {"prompt": ["Hello"] * (QUEUE + 1), "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert "queue" in error_of(r)["message"] and "retry-after" not in r.headers
    assert wait_until(lambda: idle(stack), 5)


@pytest.mark.parametrize("field, value", [
    ("max_tokens", "5"), ("max_tokens", True), ("max_tokens", 2.5), ("temperature", "0.5"),
    ("temperature", True), ("top_p", "1"), ("top_k", "3"), ("seed", "7"), ("seed", 1.5), ("stream", "yes"),
    ("stream", 1), ("ignore_eos", 0), ("logprobs", "2"), ("priority", "1"), ("stop", 5), ("prompt", 5),
    ("n", "1"),
])
def test_wrong_json_types_are_400(url, field, value):
    body = {"prompt": "Hi", "max_tokens": 2, field: value}
    r = post(url, "/v1/completions", body)
    assert r.status_code == 400, (field, value, r.text)
    assert field in error_of(r)["message"]


def test_numbers_of_the_right_kind_still_pass(url):
    r = post(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "temperature": 1, "top_p": 1, "seed": 3})
    assert r.status_code == 200, r.text


def test_names_never_leak_a_path(tiny_llama, stack):
    """Without a served name the server shows the model folder's name, not where it lives."""
    aeng = stack[2]
    app = create_app(aeng)  # the name from the engine's config: a local path here
    with ServerThread(app, "127.0.0.1", 0) as server:
        card = httpx.get(server.url + "/v1/models").json()["data"][0]
        metrics = httpx.get(server.url + "/metrics").text
    assert card["id"] == tiny_llama.name and "/" not in card["id"]
    assert str(tiny_llama) not in metrics and f'model_name="{tiny_llama.name}"' in metrics


def test_metrics_behind_the_key_when_asked(stack):
    app = create_app(stack[2], model_name="m", api_key="k", metrics_require_key=True)
    with ServerThread(app, "127.0.0.1", 0) as server:
        assert httpx.get(server.url + "/metrics").status_code == 401
        assert httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer k"}).status_code == 200
        assert httpx.get(server.url + "/health").status_code == 200  # probes stay open
    from app.cli import build_parser

    args = build_parser().parse_args(["serve", "--api-key", "k", "--metrics-require-key"])
    assert args.metrics_require_key


def test_openapi_schema_is_published(url):
    schema = httpx.get(url + "/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models"} <= set(schema["paths"])


def test_health_and_priority_reach_the_engine(url, stack, monkeypatch):
    assert httpx.get(url + "/health").status_code == 200
    loop, seen = stack[2].loop, []
    real_add = loop.add_request

    def add_request(prompt, params, *, request_id=None, priority=0):
        seen.append(priority)
        return real_add(prompt, params, request_id=request_id, priority=priority)

    monkeypatch.setattr(loop, "add_request", add_request)
    assert post(url, "/v1/completions", {"prompt": ["a", "b"], "max_tokens": 1, "priority": -3}).status_code == 200
    assert seen == [-3, -3]


def test_a_predicted_wait_beyond_the_limit_is_429(url, stack, monkeypatch):
    admission = stack[1].admission
    monkeypatch.setattr(admission, "predicted_wait_s", lambda num_waiting, queued_tokens: 2.2)
    admission.set_limits(QUEUE, 0.5)
    try:
        r = post(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
    finally:
        admission.set_limits(QUEUE, None)
    assert r.status_code == 429 and r.headers["retry-after"] == "2"  # ceil(2.2 - 0.5)
    assert error_of(r)["code"] == "predicted_wait"


# ---- the fuzz: a few hundred generated requests, good and bad, against the live server ----------------
good_prompt = st.one_of(st.text(min_size=1, max_size=40), st.lists(st.integers(3, 300), min_size=1, max_size=20))
anything = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                     st.text(max_size=10), st.lists(st.integers(-5, 500), max_size=4),
                     st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3))  # lone surrogates
number_fields = {"temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(0, 50),
                 "seed": st.integers(0, 2**32), "max_tokens": st.integers(1, 6)}


@st.composite
def completion_bodies(draw):
    body = {"prompt": draw(good_prompt), "max_tokens": draw(st.integers(1, 6))}
    for name, strategy in number_fields.items():
        if draw(st.booleans()):
            body[name] = draw(strategy)
    if draw(st.booleans()):
        body["stop"] = draw(st.lists(st.text(min_size=1, max_size=4), max_size=3))
    if draw(st.integers(0, 2)) == 0:  # a bad one: any field, any value
        body[draw(st.sampled_from([*number_fields, "stop", "prompt", "stream", "logprobs", "n", "priority",
                                   "stop_token_ids", "echo", "model", "tool_choice", "top_logprobs",
                                   "functions"]))] = draw(anything)
    if draw(st.integers(0, 3)) == 0:  # a model name: the served one, none, or one that names nothing
        body["model"] = draw(st.sampled_from([MODEL_NAME, "", "tiny-lama", "style", MODEL_NAME.upper()]))
    return body


chat_messages = st.one_of(  # well formed, or a text part / role of the wrong kind
    st.builds(lambda t: [{"role": "user", "content": [{"type": "text", "text": t}]}], anything),
    st.builds(lambda r: [{"role": r, "content": "Hi"}], st.one_of(st.just(""), st.just("  "), anything)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=completion_bodies(), chat=st.booleans(), messages=st.one_of(st.none(), chat_messages))
def test_fuzzed_requests_never_5xx_and_good_ones_finish(url, body, chat, messages):
    path = "/v1/completions"
    if chat:
        prompt = body.pop("prompt")
        body["messages"] = messages or [{"role": "user", "content": prompt if isinstance(prompt, str) else str(prompt)}]
        path = "/v1/chat/completions"
    r = post(url, path, body)
    assert r.status_code < 500, (body, r.text)
    unknown_model = isinstance(body.get("model"), str) and body["model"] not in (MODEL_NAME, "")
    if r.status_code == 404:  # only for a model that names nothing served
        assert unknown_model and error_of(r)["code"] == "model_not_found", (body, r.text)
    ignored = [f for f in ("tool_choice", "functions") if body.get(f) is not None]
    if chat and body.get("top_logprobs") is not None and not body.get("logprobs"):
        ignored.append("top_logprobs")
    if chat and messages is not None:
        part = (messages[0]["content"] or [{}])[0] if isinstance(messages[0]["content"], list) else {}
        if ("text" in part and not isinstance(part["text"], str)) or not str(messages[0]["role"]).strip():
            ignored.append("messages")
    if unknown_model or (chat and ignored):  # never served as if the field were not there
        assert r.status_code != 200, (body, r.text)
    if r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and not any('"error"' in e for e in events[:-1])
        finishes = [c["finish_reason"] for e in events[:-1] for c in json.loads(e).get("choices", ())
                    if c.get("finish_reason")]
        assert finishes and set(finishes) <= {"stop", "length"}
    elif r.status_code == 200:
        choices = r.json()["choices"]
        assert choices and all(c["finish_reason"] in ("stop", "length") for c in choices)
    else:
        assert r.status_code in (400, 404, 429) and error_of(r)["message"]


def test_after_the_fuzz_the_engine_is_empty(stack):
    assert wait_until(lambda: idle(stack), 10)
