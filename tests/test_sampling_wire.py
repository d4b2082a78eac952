"""A sampling field travels by SamplingParams' own table (engine.sampling_params.REQUEST_FIELDS): the remote
client sends it, the HTTP API reads it back, and a new field added to SamplingParams alone does both."""
from __future__ import annotations

import textwrap

import pytest

from app.remote.client import request_body, sampled_request_body, sampling_of
from app.server.protocol import ChatCompletionRequest, CompletionRequest
from engine.sampling_params import REQUEST_DEFAULTS, REQUEST_FIELDS, SamplingParams
from tests.code_copy import copy_code, edit, run_script

NOT_DEFAULT = {"temperature": 0.5, "top_p": 0.25, "top_k": 7, "seed": 3, "ignore_eos": True}


def test_the_table_is_the_scalar_fields_of_sampling_params():
    assert set(REQUEST_FIELDS) == set(NOT_DEFAULT)
    assert all(NOT_DEFAULT[n] != REQUEST_DEFAULTS[n] for n in REQUEST_FIELDS)


@pytest.mark.parametrize("chat", [False, True])
def test_every_request_field_goes_from_the_remote_client_to_the_server(chat):
    params = SamplingParams(max_tokens=9, **NOT_DEFAULT)
    path, body = sampled_request_body("m", "Hi", sampling_of(params), chat=chat)
    assert path == ("/v1/chat/completions" if chat else "/v1/completions")
    assert {n: body[n] for n in REQUEST_FIELDS} == NOT_DEFAULT
    request = ChatCompletionRequest if chat else CompletionRequest
    got = (request.model_validate(body).sampling_params(5, 2048) if chat
           else request.model_validate(body).sampling_params())
    assert {n: getattr(got, n) for n in REQUEST_FIELDS} == NOT_DEFAULT and got.max_tokens == 9


def test_defaults_stay_off_the_wire_but_the_temperature_is_always_sent():
    # a foreign server is told only what differs from the engine's defaults (llama.cpp's temperature is 0.8)
    _, body = sampled_request_body("m", "Hi", sampling_of(SamplingParams(max_tokens=4)), chat=False)
    assert body["temperature"] == 1.0 and not set(REQUEST_FIELDS) - {"temperature"} & set(body)
    _, arrival = sampled_request_body("m", "Hi", {"max_tokens": 4, "seed": 0, "ignore_eos": False}, chat=False)
    assert arrival["temperature"] == 0.8 and arrival["seed"] == 0 and "ignore_eos" not in arrival


def test_request_body_refuses_a_field_sampling_params_does_not_have():
    with pytest.raises(TypeError, match="min_p"):
        request_body("m", "Hi", max_tokens=4, temperature=0.0, chat=False, min_p=0.1)


def test_the_server_reads_request_fields_strictly_and_null_as_the_default():
    assert CompletionRequest.model_validate({"prompt": "x", "top_k": None}).sampling_params().top_k == 0
    for bad in ({"top_k": "7"}, {"top_p": True}, {"ignore_eos": None}):
        with pytest.raises(ValueError):
            CompletionRequest.model_validate({"prompt": "x", **bad})


_WALK = textwrap.dedent("""
    from pydantic import ValidationError
    from app.remote.client import sampled_request_body, sampling_of
    from app.server.protocol import CompletionRequest
    from engine.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=4, min_p=0.25)
    _, body = sampled_request_body("m", "Hi", sampling_of(params), chat=False)
    assert body["min_p"] == 0.25, body  # the remote source sends it
    assert CompletionRequest.model_validate(body).sampling_params().min_p == 0.25  # the HTTP API takes it
    try:
        CompletionRequest.model_validate({"prompt": "x", "min_p": "a lot"})
    except ValidationError:
        print("walked")
""")


def test_a_new_sampling_field_written_only_in_sampling_params_travels_over_http(tmp_path):
    """The newcomer's list, walked: a throwaway field added to engine/sampling_params.py alone (a copy of
    the code) is sent by the remote client and taken, type-checked, by the HTTP API."""
    root = copy_code(tmp_path)
    edit(root / "engine" / "sampling_params.py", "    top_k: int = 0  # 0 means off\n",
         "    min_p: float = 0.0  # throwaway\n")
    assert "walked" in run_script(root, _WALK)


_GUI_WALK = textwrap.dedent("""
    import time, types
    from PySide6.QtWidgets import QApplication
    app = QApplication([])
    from app.gui.controller import AppController
    from app.gui.control_state import ControlState
    from app.gui.preset_actions import PresetActions
    from app.load.generator import LoadGenerator
    from app.remote.client import sampled_request_body
    from app.server.protocol import CompletionRequest
    from app.talk import presets
    from app.talk.knob_defaults import engine_knob_defaults, knob_defaults, knob_stops
    from engine.sampling_params import SamplingParams
    from widgets.controls import ControlsPanel

    preset = presets.load_preset("p.toml")  # a preset sets it
    assert preset.load.min_p == 0.25
    gen = LoadGenerator(preset.load, corpus_ids=list(range(1000, 3000)), rng_seed=0)
    gen.start(0.0)
    arrival = gen.due(0.0)[0]  # every generated request samples with it
    assert arrival.sampling["min_p"] == 0.25 and SamplingParams(**arrival.sampling).min_p == 0.25
    _, body = sampled_request_body("m", "Hi", arrival.sampling, chat=False)  # attached: sent to the server
    assert CompletionRequest.model_validate(body).sampling_params().min_p == 0.25

    panel = ControlsPanel(defaults=knob_defaults(), stops=knob_stops())  # its slider, in the Load generator box
    assert panel.row("min_p").value() == 0.0
    got = []
    panel.sigLoadChanged.connect(got.append)
    panel.row("min_p").slider.setValue(5)
    end = time.monotonic() + 5
    while not got and time.monotonic() < end:
        app.processEvents()
        time.sleep(0.02)
    assert got and got[-1]["min_p"] == 0.05, got

    sent = []  # the controller turns the slider's value into the source's LoadConfig
    host = types.SimpleNamespace(set_load_config=sent.append, set_arrival_rate=lambda rate: None, info=None)
    state = ControlState(config=engine_knob_defaults(), arrival_rate=1.0, source_name="t", start_kv_blocks=None)
    state.preset = preset
    ctl = types.SimpleNamespace(state=state, host=host, meter=types.SimpleNamespace(set_config=lambda c: None),
                                live_scale=types.SimpleNamespace(user_set=lambda: None))  # the slider's own rate
    ctl.presets = PresetActions(window=None, host=host, panels=None, caption=None, cues=None, state=state, verbs=None)
    ctl.set_arrival_rate = lambda rate: AppController.set_arrival_rate(ctl, rate)
    ctl._set_rate = lambda rate: AppController._set_rate(ctl, rate)
    AppController.set_load(ctl, got[-1])
    assert sent[-1].min_p == 0.05 and sent[-1].prompt_tokens == preset.load.prompt_tokens, sent
    print("walked")
""")


def test_a_new_sampling_field_with_its_slider_walks_the_list(tmp_path):
    """The newcomer's list for a sampling field with its GUI control, walked in a copy: SamplingParams'
    field, LoadConfig's, the preset key and the slider's row. A preset sets it, every generated request
    carries it (embedded or attached), the Load generator slider shows it and reaches the source's
    LoadConfig through the controller. (Reshaping the distribution is shape_logits' in sampler.py.)"""
    root = copy_code(tmp_path)
    edit(root / "engine" / "sampling_params.py", "    top_k: int = 0  # 0 means off\n",
         "    min_p: float = 0.0  # throwaway\n")
    edit(root / "app" / "load" / "generator.py", "    temperature: float = 0.8\n", "    min_p: float = 0.0\n")
    edit(root / "app" / "talk" / "presets.py", '"temperature": (_number(0.0), 0.8), ', '"min_p": (_number(0.0), 0.0), ')
    controls = root / "widgets" / "controls.py"
    edit(controls, 'LOAD_KEYS = ("arrival_rate",', ' "min_p"')
    edit(controls, '    "arrival_rate": ("arrival rate", [i / 10 for i in range(201)], lambda v: f"{v:.1f} req/s"),\n',
         '    "min_p": ("min p", [i / 100 for i in range(51)], lambda v: f"{v:.2f}"),\n')
    (root / "p.toml").write_text('[preset]\ntitle = "T"\ncaption = "C"\n[workload]\nmin_p = 0.25\n')
    assert "walked" in run_script(root, _GUI_WALK)
