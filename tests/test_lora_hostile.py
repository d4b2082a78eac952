"""Adapters that lie (issue 26, class 3): NaN, infinite or 1e30 weights or lora_alpha, rank-0 tensors, bad
alpha patterns, a config that is a JSON list. Each is refused when it is loaded, with a 400 that says why
and names no server path; the server goes on serving. Adapter names have limits, and never take the base
model's name."""
from __future__ import annotations

import contextlib
import json
import shutil

import httpx
import pytest
import torch
from lora_helpers import make_adapter
from safetensors.torch import load_file, save_file
from server_helpers import MODEL_NAME

from engine import EngineConfig, LLMEngine


def _weights(value=None, tensor=None):
    """Change the first lora_A: one element set to `value`, or the whole tensor replaced by `tensor`."""
    def edit(tensors: dict) -> None:
        key = sorted(k for k in tensors if "lora_A" in k)[0]
        if tensor is not None:
            tensors[key] = tensor(tensors[key])
        else:
            tensors[key][0, 0] = value
    return edit


def _config(**changes):
    def edit(cfg: dict):
        cfg.update(changes)
        return cfg
    return edit


LIES = {  # name -> (edit of the weights, edit of adapter_config.json, what the 400 says)
    "nan weight": (_weights(float("nan")), None, "not finite"),
    "inf weight": (_weights(float("inf")), None, "not finite"),
    "huge weight": (_weights(1e30), None, "magnitude"),
    "rank-0 tensor": (_weights(tensor=lambda a: torch.tensor(1.0)), None, "lora_A ()"),
    "rank 0": (_weights(tensor=lambda a: a[:0]), None, "r >= 1"),
    "int weights": (_weights(tensor=lambda a: a.to(torch.int32)), None, "floating-point"),
    "nan alpha": (None, _config(lora_alpha=float("nan")), "lora_alpha"),
    "inf alpha": (None, _config(lora_alpha=float("inf")), "lora_alpha"),
    "huge alpha": (None, _config(lora_alpha=1e30), "lora_alpha"),
    "string alpha": (None, _config(lora_alpha="8"), "lora_alpha"),
    "alpha_pattern list": (None, _config(alpha_pattern=["q_proj"]), "alpha_pattern"),
    "alpha_pattern bad regex": (None, _config(alpha_pattern={"(": 8}), "alpha_pattern"),
    "alpha_pattern bad value": (None, _config(alpha_pattern={"q_proj": "big"}), "alpha_pattern"),
    "alpha_pattern huge value": (None, _config(alpha_pattern={"q_proj": 1e30}), "alpha_pattern"),
    "rank_pattern list": (None, _config(rank_pattern=[4]), "rank_pattern"),
    "string rslora": (None, _config(use_rslora="yes"), "use_rslora"),
    "zero r": (None, _config(r=0), "r must be"),
    "config is a list": (None, lambda cfg: [cfg], "JSON object"),
}


@pytest.fixture(scope="module")
def good_adapter(tiny_llama, tmp_path_factory):
    return make_adapter(tiny_llama, tmp_path_factory.mktemp("good") / "good", rank=4)


def lie(good, folder, edit_weights, edit_config):
    shutil.copytree(good, folder)
    if edit_weights is not None:
        tensors = load_file(str(folder / "adapter_model.safetensors"))
        edit_weights(tensors)
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    if edit_config is not None:
        path = folder / "adapter_config.json"
        path.write_text(json.dumps(edit_config(json.loads(path.read_text()))))
    return folder


@contextlib.contextmanager
def lora_server(tiny_llama, lora_dir):
    from app.server import ServerThread, create_app
    from engine.serving.async_engine import AsyncEngine

    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, max_loras=1))
    aeng = AsyncEngine(engine).start()
    server = ServerThread(create_app(aeng, model_name=MODEL_NAME, lora_dir=str(lora_dir)), "127.0.0.1", 0).start()
    try:
        yield server, engine
    finally:
        server.stop()
        aeng.shutdown()


def test_every_lying_adapter_is_refused_at_load_with_a_400_and_no_path(tiny_llama, good_adapter, tmp_path):
    lora_dir = tmp_path / "loras"
    for i, (edit_weights, edit_config, _why) in enumerate(LIES.values()):
        lie(good_adapter, lora_dir / f"lie{i}", edit_weights, edit_config)
    with lora_server(tiny_llama, lora_dir) as (server, engine), httpx.Client(timeout=60) as client:
        wrong = {}  # every case is tried, so a failure lists all the lies that got through
        for i, (name, (_w, _c, why)) in enumerate(LIES.items()):
            try:
                reply = client.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": f"lie{i}",
                                                                               "lora_path": f"lie{i}"})
            except httpx.HTTPError as exc:  # the server dropped the connection
                wrong[name] = repr(exc)
                continue
            message = reply.json().get("error", {}).get("message", "")
            if reply.status_code != 400 or why not in message or str(tmp_path) in message or "/tmp" in message:
                wrong[name] = (reply.status_code, reply.text[:200])
        assert wrong == {}
        assert engine.list_loras() == ()
        reply = client.post(f"{server.url}/v1/completions", json={"model": MODEL_NAME, "prompt": [5, 6, 7],
                                                                 "max_tokens": 4, "temperature": 0})
        assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("name", ["", "x" * 65, "two words", "../up", "naïve", "-dash-first", MODEL_NAME])
def test_adapter_names_have_limits_and_never_take_the_base_models_name(tiny_llama, good_adapter, tmp_path,
                                                                      name):
    shutil.copytree(good_adapter, tmp_path / "loras" / "good")
    with lora_server(tiny_llama, tmp_path / "loras") as (server, engine):
        reply = httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": "good"},
                           timeout=60)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "lora_name"
        assert engine.list_loras() == ()


def test_the_engine_refuses_a_bad_name_and_a_lying_adapter_too(tiny_llama, good_adapter, tmp_path):
    from engine.lora.adapter import LoraLoadError

    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, max_loras=1))
    with pytest.raises(ValueError, match="1 to 64 characters"):
        engine.add_lora("a b", str(good_adapter))
    bad = lie(good_adapter, tmp_path / "nan", *LIES["nan weight"][:2])
    with pytest.raises(LoraLoadError, match="not finite"):
        engine.add_lora("nan", str(bad))
    assert engine.add_lora("good", str(good_adapter)).name == "good"
