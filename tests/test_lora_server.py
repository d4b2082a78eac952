"""`inferlab serve --lora NAME=PATH`: the request's `model` field picks the adapter, /v1/models lists them."""
from __future__ import annotations

import argparse

import httpx
import pytest
from lora_helpers import make_adapter
from server_helpers import MODEL_NAME, serving

from engine import EngineConfig, LLMEngine, SamplingParams


def test_model_field_picks_the_adapter(tiny_llama, tmp_path):
    path = make_adapter(tiny_llama, tmp_path / "style", rank=4)
    with serving(tiny_llama, max_loras=1) as (server, engine, _aeng):
        engine.add_lora("style", str(path))
        with httpx.Client(timeout=30) as client:
            models = client.get(f"{server.url}/v1/models").json()["data"]
            assert [m["id"] for m in models] == [MODEL_NAME, "style"]
            assert models[1]["parent"] == MODEL_NAME and models[1]["root"] == "style"
            assert str(tmp_path) not in str(models)  # a name, never a local path
            texts = {}
            missing = client.post(f"{server.url}/v1/completions", json={
                "model": "not-an-adapter", "prompt": [5, 17, 42, 99, 7], "max_tokens": 8})
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
            for model in (MODEL_NAME, "style"):
                reply = client.post(f"{server.url}/v1/completions", json={
                    "model": model, "prompt": [5, 17, 42, 99, 7], "max_tokens": 8, "temperature": 0,
                    "ignore_eos": True})
                assert reply.status_code == 200, reply.text
                texts[model] = reply.json()["choices"][0]["text"]
                assert reply.json()["model"] == (model if model == "style" else MODEL_NAME)
    assert texts["style"] != texts[MODEL_NAME]
    want = engine.generate([[5, 17, 42, 99, 7]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
                           lora_names=["style"])[0].text
    assert texts["style"] == want


def test_serve_args_make_the_pool():
    from app.server.serve import add_serve_args, engine_config, lora_args

    def engine_args(p):
        for flag in ("--model", "--dtype", "--device"):
            p.add_argument(flag, default="auto" if flag != "--model" else "m")
        p.add_argument("--threads", type=int, default=None)

    p = argparse.ArgumentParser()
    add_serve_args(p, engine_args)
    args = p.parse_args(["--lora", "a=/x", "--lora", "b=/y", "--max-lora-rank", "8"])
    assert lora_args(args.lora) == [("a", "/x"), ("b", "/y")]
    cfg = engine_config(args)
    assert (cfg.max_loras, cfg.max_lora_rank) == (2, 8)
    with pytest.raises(ValueError, match="NAME=PATH"):
        lora_args(["just-a-path"])


def test_runtime_loading_is_off_by_default(tiny_llama):
    with serving(tiny_llama, max_loras=1) as (server, _engine, _aeng):
        reply = httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"})
        assert reply.status_code == 404


def test_runtime_loading_only_inside_lora_dir(tiny_llama, tmp_path):
    from app.server import ServerThread, create_app
    from engine.serving.async_engine import AsyncEngine

    allowed = tmp_path / "allowed"
    inside = make_adapter(tiny_llama, allowed / "style", rank=4)
    outside = make_adapter(tiny_llama, tmp_path / "outside", rank=4)
    (allowed / "sneaky").symlink_to(outside)
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, max_loras=1))
    aeng = AsyncEngine(engine).start()
    server = ServerThread(create_app(aeng, model_name=MODEL_NAME, lora_dir=str(allowed)), "127.0.0.1", 0).start()
    try:
        url = f"{server.url}/v1/load_lora_adapter"
        for path in ("../outside", str(outside), "sneaky", "/etc"):
            reply = httpx.post(url, json={"lora_name": "bad", "lora_path": path}, timeout=30)
            assert reply.status_code == 403, (path, reply.text)
            assert "--lora-dir" in reply.json()["error"]["message"]
        assert engine.list_loras() == ()
        reply = httpx.post(url, json={"lora_name": "style", "lora_path": "style"}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert [a.path for a in engine.list_loras()] == [str(inside.resolve())]
        reply = httpx.post(url, json={"lora_name": "style", "lora_path": "style"}, timeout=30)
        assert reply.status_code == 400 and "already loaded" in reply.text
        reply = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "style"}, timeout=30)
        assert reply.status_code == 200 and engine.list_loras() == ()
    finally:
        server.stop()
        aeng.shutdown()
