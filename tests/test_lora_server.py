"""`inferlab serve --lora NAME=PATH`: the request's `model` field picks the adapter, /v1/models lists them."""
from __future__ import annotations

import argparse

import httpx
import pytest
from lora_helpers import make_adapter
from server_helpers import MODEL_NAME, serving

from engine import SamplingParams


def test_model_field_picks_the_adapter(tiny_llama, tmp_path):
    path = make_adapter(tiny_llama, tmp_path / "style", rank=4)
    with serving(tiny_llama, max_loras=1) as (server, engine, _aeng):
        engine.add_lora("style", str(path))
        with httpx.Client(timeout=30) as client:
            models = client.get(f"{server.url}/v1/models").json()["data"]
            assert [m["id"] for m in models] == [MODEL_NAME, "style"]
            assert models[1]["parent"] == MODEL_NAME and models[1]["root"] == str(path)
            texts = {}
            for model in (MODEL_NAME, "style", "not-an-adapter"):
                reply = client.post(f"{server.url}/v1/completions", json={
                    "model": model, "prompt": [5, 17, 42, 99, 7], "max_tokens": 8, "temperature": 0,
                    "ignore_eos": True})
                assert reply.status_code == 200, reply.text
                texts[model] = reply.json()["choices"][0]["text"]
                assert reply.json()["model"] == (model if model == "style" else MODEL_NAME)
    assert texts["style"] != texts[MODEL_NAME] == texts["not-an-adapter"]
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
