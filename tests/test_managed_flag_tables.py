"""vLLM's and SGLang's flag tables (app/managed/vllm.py, sglang.py): the argv each builds across
the tuning knobs, the values each refuses before launching (FlagError naming what it takes), that every
flag it emits is on its documented rows, and that the stand-in engine's parser (tests/standin_server.py)
takes every argv the tables build; `inferlab tune --show-flags` prints a table."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import standin_server

from app.cli import main as cli_main
from app.managed.describe import describe_table
from app.managed.engines import ENGINES
from app.managed.sglang import SglangEngine
from app.managed.table import FlagError, ServedModel, ServerPoint
from app.managed.vllm import VllmEngine
from app.tradeoff.tune_cli import sized_engine
from app.tradeoff.tune_measure import TuneLoad

MODEL = ServedModel({"bf16": "org/m-16", "awq": "org/m-awq"}, draft="org/m-draft", name="m")
NO_DRAFT = ServedModel({"bf16": "org/m-16"}, name="m")
PORT = 8123


def flags_after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def assert_runs(argv: list[str], present: list[str], absent: list[str]) -> None:
    """Each of `present` stands in argv as a run of whole words (a value right after its flag); no word of
    `absent` stands in it at all."""
    joined = f" {' '.join(argv)} "
    assert all(f" {run} " in joined for run in present), joined
    assert not any(word in argv for word in absent), joined


def test_vllm_plain_point_is_vllm_serve_with_host_port_name_and_batch():
    argv = VllmEngine().argv("vllm", MODEL, ServerPoint(batch=8), PORT)
    assert argv == ["vllm", "serve", "org/m-16", "--served-model-name", "m", "--max-num-seqs", "8",
                    "--host", "127.0.0.1", "--port", "8123"]
    assert argv[2:-4] == VllmEngine().point_flags(MODEL, ServerPoint(batch=8))


def test_sglang_plain_point_is_launch_server_with_host_port_name_and_batch():
    argv = SglangEngine().argv("/venv/bin/python", MODEL, ServerPoint(batch=8), PORT)
    assert argv == ["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "org/m-16",
                    "--served-model-name", "m", "--max-running-requests", "8", "--host", "127.0.0.1",
                    "--port", "8123"]
    assert argv[3:-4] == SglangEngine().point_flags(MODEL, ServerPoint(batch=8))


@pytest.mark.parametrize("point, present, absent", [
    (ServerPoint(batch=32), ["--max-num-seqs 32"], ["--quantization"]),
    (ServerPoint(weight_format="fp8"), ["serve org/m-16", "--quantization fp8"], []),           # online fp8
    (ServerPoint(weight_format="awq"), ["serve org/m-awq"], ["--quantization"]),                  # its own config
    (ServerPoint(kv_dtype="fp8"), ["--kv-cache-dtype fp8"], []),
    (ServerPoint(kv_dtype="f16"), ["--kv-cache-dtype float16"], []),                 # neutral name
    (ServerPoint(chunked_prefill=False), ["--no-enable-chunked-prefill"], ["--enable-chunked-prefill"]),
    (ServerPoint(chunked_prefill=True), ["--enable-chunked-prefill"], ["--no-enable-chunked-prefill"]),
    (ServerPoint(prefix_caching=False), ["--no-enable-prefix-caching"], ["--enable-prefix-caching"]),
    (ServerPoint(prefix_caching=True), ["--enable-prefix-caching"], ["--no-enable-prefix-caching"]),
    (ServerPoint(), [], ["--kv-cache-dtype", "--speculative-config", "--enable-chunked-prefill",
                         "--no-enable-chunked-prefill", "--enable-prefix-caching", "--no-enable-prefix-caching"]),
])
def test_vllm_knobs_map_to_its_flags(point, present, absent):
    argv = VllmEngine().argv("vllm", MODEL, point, PORT)
    assert_runs(argv, present, absent)


def test_vllm_draft_is_one_speculative_config_json_with_the_draft_model_or_ngram_without_one():
    argv = VllmEngine().argv("vllm", MODEL, ServerPoint(draft=3), PORT)
    assert json.loads(flags_after(argv, "--speculative-config")) == {
        "method": "draft_model", "model": "org/m-draft", "num_speculative_tokens": 3}
    argv = VllmEngine().argv("vllm", NO_DRAFT, ServerPoint(draft=3), PORT)
    assert json.loads(flags_after(argv, "--speculative-config")) == {"method": "ngram", "num_speculative_tokens": 3}


def test_sglang_draft_without_a_draft_model_is_ngram_lookup():
    argv = SglangEngine().argv("python", NO_DRAFT, ServerPoint(draft=3), PORT)
    assert_runs(argv, ["--speculative-algorithm NGRAM --speculative-num-draft-tokens 4"],
                ["--speculative-draft-model-path", "--speculative-num-steps", "STANDALONE"])


@pytest.mark.parametrize("point, present, absent", [
    (ServerPoint(batch=32), ["--max-running-requests 32"], ["--quantization"]),
    (ServerPoint(weight_format="fp8"), ["--model-path org/m-16", "--quantization fp8"], []),
    (ServerPoint(weight_format="awq"), ["--model-path org/m-awq"], ["--quantization"]),
    (ServerPoint(kv_dtype="fp8"), ["--kv-cache-dtype fp8_e4m3"], []),                # SGLang has no bare fp8
    (ServerPoint(kv_dtype="bf16"), ["--kv-cache-dtype bf16"], []),
    (ServerPoint(chunked_prefill=False), ["--chunked-prefill-size -1"], []),
    (ServerPoint(chunked_prefill=True), [], ["--chunked-prefill-size"]),                # SGLang sizes it
    (ServerPoint(prefix_caching=False), ["--disable-radix-cache"], []),
    (ServerPoint(prefix_caching=True), [], ["--disable-radix-cache"]),
    (ServerPoint(draft=4), ["--speculative-algorithm STANDALONE --speculative-draft-model-path org/m-draft "
                            "--speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5"],
     []),
    (ServerPoint(), [], ["--kv-cache-dtype", "--speculative-algorithm", "--chunked-prefill-size",
                         "--disable-radix-cache"]),
])
def test_sglang_knobs_map_to_its_flags(point, present, absent):
    argv = SglangEngine().argv("python", MODEL, point, PORT)
    assert_runs(argv, present, absent)


@pytest.mark.parametrize("engine", [VllmEngine(), SglangEngine()], ids=["vllm", "sglang"])
@pytest.mark.parametrize("point, model, says", [
    (ServerPoint(kv_dtype="q8_0"), MODEL, "fp8_e5m2"),            # llama.cpp's type: the accepted list named
    (ServerPoint(weight_format="awq"), ServedModel({"bf16": "org/m-16"}, draft="d", name="m"), "no awq checkpoint"),
    (ServerPoint(weight_format="fp8"), ServedModel({"awq": "org/m-awq"}, name="m"), "no fp8 checkpoint"),
    (ServerPoint(weight_format="int8"), MODEL, "weight format 'int8': not one .* serves"),  # inferlab's, not theirs
    (ServerPoint(weight_format="q4_1"), MODEL, "the names: bf16, fp8, awq, gptq"),        # llama.cpp's
    (ServerPoint(draft=-1), MODEL, "at least 1"),
    (ServerPoint(batch=0), MODEL, "at least 1"),
])
def test_a_value_the_engine_cannot_take_is_a_flag_error_saying_why(engine, point, model, says):
    with pytest.raises(FlagError, match=says):
        engine.argv(engine.executable, model, point, PORT)


def test_kv_dtype_each_engine_spells_otherwise_is_refused_with_its_list():
    with pytest.raises(FlagError, match="sglang --kv-cache-dtype does not take 'float16'; accepted: auto, "):
        SglangEngine().argv("python", MODEL, ServerPoint(kv_dtype="float16"), PORT)
    with pytest.raises(FlagError, match="vllm --kv-cache-dtype does not take 'fp4_mx_block16'"):
        VllmEngine().argv("vllm", MODEL, ServerPoint(kv_dtype="fp4_mx_block16"), PORT)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_online_quantization_method_outside_the_engines_list_is_refused(engine):
    from app.managed.hf_flags import weights_and_quantization

    with pytest.raises(FlagError, match=rf"{engine} --quantization does not take 'fp8'; accepted: awq, gptq"):
        weights_and_quantization(engine, MODEL, ServerPoint(weight_format="fp8"), ("awq", "gptq"))


EVERY_KNOB = [ServerPoint(batch=4, weight_format="fp8", kv_dtype="fp8", draft=2, chunked_prefill=c, prefix_caching=c)
              for c in (False, True)]


@pytest.mark.parametrize("engine", [VllmEngine(), SglangEngine()], ids=["vllm", "sglang"])
def test_every_flag_an_argv_carries_is_on_the_engines_documented_rows(engine):
    documented = " ".join(row.flag for row in engine.rows)
    for model in (MODEL, NO_DRAFT):
        for point in EVERY_KNOB:
            flags = [t for t in engine.argv(engine.executable, model, point, PORT) if t.startswith("--")]
            assert flags and all(f in documented for f in flags), (flags, documented)


@pytest.mark.parametrize("engine, parse", [(VllmEngine(), standin_server.vllm_args),
                                           (SglangEngine(), standin_server.sglang_args)], ids=["vllm", "sglang"])
def test_the_standin_parser_takes_every_argv_the_table_builds(engine, parse):
    for model in (MODEL, NO_DRAFT):
        for point in [ServerPoint(), *EVERY_KNOB]:
            args = parse(engine.argv(engine.executable, model, point, PORT)[1:], set())
            assert args.port == PORT


def test_the_standin_refuses_what_the_engine_refuses(capsys):
    with pytest.raises(SystemExit) as exit_:  # vLLM: metavar on the command line, refused by CacheConfig
        standin_server.vllm_args(["serve", "m", "--kv-cache-dtype", "q8_0"], set())
    assert exit_.value.code == 1 and "Invalid kv_cache_dtype: 'q8_0'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # SGLang: argparse choices
        standin_server.sglang_args(["-m", "sglang.launch_server", "--model-path", "m", "--kv-cache-dtype",
                                    "fp8"], set())
    assert exit_.value.code == 2 and "invalid choice: 'fp8'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # an older release without a flag
        standin_server.vllm_args(["serve", "m", "--max-num-seqs", "4"], {"--max-num-seqs"})
    assert exit_.value.code == 2 and "unrecognized arguments: --max-num-seqs 4" in capsys.readouterr().err


@pytest.mark.parametrize("argv, on", [(["--enable-prefix-caching"], True), (["--no-enable-prefix-caching"], False),
                                      (["--disable-prefix-caching"], False), ([], None)])
def test_the_vllm_standin_takes_each_spelling_of_an_enable_disable_switch(argv, on):
    assert standin_server.vllm_args(["serve", "m", *argv], set()).enable_prefix_caching is on


@pytest.mark.parametrize("engine, version, flag", [(VllmEngine(), "vLLM 0.33.0", "--max-num-seqs N"),
                                                   (SglangEngine(), "SGLang 0.5.23", "--max-running-requests N")])
def test_describe_table_names_the_version_read_and_each_knobs_flag(engine, version, flag):
    text = describe_table(engine)
    assert version in text.splitlines()[0]
    assert f"| batch | `{flag}` |" in text
    assert {row.knob for row in engine.rows} >= {"batch", "weight_format", "kv_dtype", "draft", "chunked_prefill",
                                                "prefix_caching", "health"}
    assert "--port 8000" in text.splitlines()[-1]  # the launch line the table itself builds


def test_both_engines_are_registered_for_inferlab_tune():
    assert isinstance(ENGINES["vllm"], VllmEngine) and isinstance(ENGINES["sglang"], SglangEngine)


@pytest.mark.parametrize("engine", [VllmEngine(), SglangEngine()], ids=["vllm", "sglang"])
def test_the_docs_show_each_tables_current_description(engine):
    page = (Path(__file__).parents[1] / "docs" / "servers.md").read_text()
    assert describe_table(engine) in page  # regenerate the docs' tables when a table changes


def test_inferlab_tune_show_flags_prints_the_engines_table(capsys):
    assert cli_main(["tune", "--engine", "sglang", "--show-flags"]) == 0
    assert capsys.readouterr().out.strip() == describe_table(SglangEngine())
    assert cli_main(["tune", "--engine", "tgi", "--show-flags"]) == 2
    assert "unknown engine 'tgi' (have: llama-server, inferlab, vllm, sglang)" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_server_args_are_appended_to_every_command_line(name):
    engine = sized_engine(ENGINES[name], TuneLoad(), ("--tensor-parallel-size", "2"))
    for point in (ServerPoint(), ServerPoint(batch=2, draft=2)):
        assert engine.argv(engine.executable, MODEL, point, PORT)[-2:] == ["--tensor-parallel-size", "2"]
