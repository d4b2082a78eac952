"""`inferlab serve` through the official openai client and raw httpx: completions and chat, streaming
and not, usage, stop strings, logprobs, SSE framing and the OpenAI-style 400s."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from server_helpers import MODEL_NAME, serving, sse_events

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world!"}]


@pytest.fixture(scope="module")
def stack(tiny_llama):
    with serving(tiny_llama) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack):
    server, _engine, _aeng = stack
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def url(stack):
    return stack[0].url


def test_models(client, stack):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert models[0].max_model_len == stack[1].max_model_len


def test_completion_streamed_equals_non_streamed_and_usage(client, stack):
    kw = dict(model=MODEL_NAME, prompt="The quick brown fox", max_tokens=24, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    assert full.object == "text_completion" and full.choices[0].finish_reason == "length"
    n_prompt = len(stack[1].tokenizer.encode("The quick brown fox"))
    assert (full.usage.prompt_tokens, full.usage.completion_tokens, full.usage.total_tokens) == (
        n_prompt, 24, n_prompt + 24)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_streamed_equals_non_streamed(client, stack):
    kw = dict(model=MODEL_NAME, messages=CHAT, max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    msg = full.choices[0].message
    assert full.object == "chat.completion" and msg.role == "assistant" and full.usage.completion_tokens == 20
    tok = stack[1].tokenizer
    prompt = tok.encode(tok.apply_chat_template(CHAT), add_special_tokens=False)
    assert full.usage.prompt_tokens == len(prompt)
    # the same prompt through /v1/completions (token ids) gives the same text: the chat template is applied
    same = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=20, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert same.choices[0].text == msg.content
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == msg.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_string_and_seeded_sampling(client):
    base = client.completions.create(model=MODEL_NAME, prompt="Paged attention", max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text
    stop = base[3:6]
    assert stop and stop in base
    cut = client.completions.create(model=MODEL_NAME, prompt="Paged attention", max_tokens=16, temperature=0,
                                    stop=[stop, "never-there"], extra_body={"ignore_eos": True})
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == base[: base.index(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL_NAME, prompt="Paged attention", max_tokens=16, temperature=0, stop=stop, stream=True,
        extra_body={"ignore_eos": True}))
    assert streamed == cut.choices[0].text  # a partial stop string is held back, never streamed
    kw = dict(model=MODEL_NAME, prompt="Hello", max_tokens=12, temperature=1.0, top_p=0.9, seed=7,
              extra_body={"top_k": 50, "ignore_eos": True})
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


def test_logprobs(client):
    r = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=5, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(v <= 0 for v in lp.token_logprobs) and all(len(t) == 2 for t in lp.top_logprobs)
    c = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = c.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 3 for t in content)
    assert content[0].logprob == max(t.logprob for t in content[0].top_logprobs)  # greedy picks the best


def test_sse_framing(url):
    body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 6, "stream": True, "temperature": 0,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    blocks = raw.split("\n\n")[:-1]
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks)  # one data line per event
    events = sse_events(raw.splitlines())
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 6
    assert all(e["object"] == "text_completion" and e["id"] == events[0]["id"] for e in events[:-1])


def test_batch_of_prompts(client):
    r = client.completions.create(model=MODEL_NAME, prompt=["Hello", "The quick"], max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1] and r.usage.completion_tokens == 10
    one = client.completions.create(model=MODEL_NAME, prompt="The quick", max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert r.choices[1].text == one.choices[0].text


def _error(resp: httpx.Response) -> dict:
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


@pytest.mark.parametrize("body, needle", [
    ("{not json", "not valid JSON"),
    (json.dumps({"prompt": "Hi", "max_tokens": -1}), "max_tokens"),
    (json.dumps({"prompt": "Hi", "top_p": 0}), "top_p"),
    (json.dumps({"prompt": "Hi", "temperature": -1}), "temperature"),
    (json.dumps({"prompt": "Hi", "max_tokens": "many"}), "max_tokens"),
    (json.dumps({"max_tokens": 3}), "prompt"),
    (json.dumps({"prompt": "Hi", "n": 2}), "n=1"),
    (json.dumps({"prompt": ""}), "empty"),
    (json.dumps({"prompt": [999999]}), "token ids"),
])
def test_bad_input_is_400(url, body, needle):
    r = httpx.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["type"] == "invalid_request_error" and needle in err["message"]


def test_prompt_beyond_context_is_400(url, stack):
    engine = stack[1]
    long_prompt = list(range(10, 10 + engine.max_model_len))
    r = httpx.post(url + "/v1/completions", json={"prompt": long_prompt, "max_tokens": 1})
    assert r.status_code == 400 and _error(r)["code"] == "context_length_exceeded"
    messages = [{"role": "user", "content": "Hello world! " * 200}]
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages})
    assert r.status_code == 400 and "context length" in _error(r)["message"]
    with pytest.raises(openai.BadRequestError):
        openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0).completions.create(
            model=MODEL_NAME, prompt=long_prompt, max_tokens=1)


def test_unknown_route_is_openai_json_404(url):
    r = httpx.get(url + "/v1/nothing")
    assert r.status_code == 404 and _error(r)["type"] == "not_found_error"


def test_metrics_exposition(url, client):
    client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=3, temperature=0)
    text = httpx.get(url + "/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
                 "generation_tokens_total", "prefix_cache_hits_total", "prefix_cache_queries_total",
                 "num_preemptions_total", "request_rejected_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total"):
        assert f'inferlab:{name}{{model_name="{MODEL_NAME}"}} ' in text, name
    for hist in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        assert f"# TYPE inferlab:{hist} histogram" in text
        count = next(line for line in text.splitlines() if line.startswith(f"inferlab:{hist}_count"))
        assert float(count.split()[-1]) > 0  # Prometheus values are floats ("3.0")
    # prometheus_client writes labels sorted by name, as vLLM's and SGLang's exporters (the same library) do
    assert 'inferlab:time_to_first_token_seconds_bucket{le="+Inf",model_name="tiny-llama"}' in text
