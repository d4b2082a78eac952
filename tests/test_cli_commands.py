"""`generate` and `serve` flags of issue 49 (point 7): the prompt from stdin or a file, a system message,
JSON output, weight bits / speculation / a LoRA adapter as `serve` takes them (each output equal to the
engine's own for the same settings); `serve --compile --max-model-len --chat-template`; the group size
`serve` quantizes in is the explorer's; every option of every command shows its default in --help."""
from __future__ import annotations

import argparse
import io
import json

import pytest

from app.cli import build_parser, main
from engine import EngineConfig, LLMEngine, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32"))


def generate(argv: list[str], capsys, monkeypatch=None, stdin: str | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        fake = io.StringIO(stdin)
        fake.isatty = lambda: False
        monkeypatch.setattr("sys.stdin", fake)
    code = main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def base(tiny_llama) -> list[str]:
    return ["--model", str(tiny_llama), "--dtype", "float32", "--max-tokens", "6"]


def test_prompt_from_stdin_and_from_a_file_is_the_same_prompt(tiny_llama, engine, capsys, monkeypatch, tmp_path):
    expected = engine.generate(["Hello world"], SamplingParams(max_tokens=6, temperature=0.0))[0].text + "\n"
    code, out, err = generate([*base(tiny_llama), "--raw"], capsys, monkeypatch, stdin="Hello world\n")
    assert code == 0 and out == expected, err
    code, out, err = generate([*base(tiny_llama), "--raw", "--prompt", "-"], capsys, monkeypatch, stdin="Hello world")
    assert code == 0 and out == expected, err
    f = tmp_path / "prompt.txt"
    f.write_text("Hello world", encoding="utf-8")
    code, out, err = generate([*base(tiny_llama), "--raw", "--prompt-file", str(f)], capsys)
    assert code == 0 and out == expected, err


@pytest.mark.parametrize("flags, stdin, says", [
    (["--prompt-file", "/nonexistent/prompt.txt"], None, "--prompt-file /nonexistent/prompt.txt"),
    ([], "", "empty"),
])
def test_a_missing_prompt_is_one_error_line(tiny_llama, capsys, monkeypatch, flags, stdin, says):
    code, out, err = generate([*base(tiny_llama), *flags], capsys, monkeypatch, stdin=stdin)
    assert code == 2 and out == "" and err.count("inferlab: error:") == 1 and says in err


def test_system_message_goes_through_the_chat_template(tiny_llama, engine, capsys):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world"}]
    templated = engine.tokenizer.apply_chat_template(messages)
    expected = engine.generate([templated], SamplingParams(max_tokens=6, temperature=0.0))[0].text
    code, out, err = generate([*base(tiny_llama), "--prompt", "Hello world", "--system", "Be brief."], capsys)
    assert code == 0 and out == expected + "\n", err
    code, _out, err = generate([*base(tiny_llama), "--raw", "--prompt", "hi", "--system", "x"], capsys)
    assert code == 2 and "--system" in err


def test_json_output_holds_the_text_and_tokens(tiny_llama, engine, capsys):
    expected = engine.generate(["Hello world"], SamplingParams(max_tokens=6, temperature=0.0))[0]
    code, out, err = generate([*base(tiny_llama), "--raw", "--prompt", "Hello world", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["text"] == expected.text and doc["token_ids"] == list(expected.token_ids)
    assert doc["finish_reason"] == expected.finish_reason and doc["ttft_s"] > 0 and doc["lora"] is None


def test_quant_and_speculation_flags_reach_the_engine(tiny_llama, capsys):
    q8 = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", quant_bits=8, quant_group_size=64))
    assert q8.config.quant_bits == 8
    expected = q8.generate(["Hello world"], SamplingParams(max_tokens=6, temperature=0.0))[0].text
    code, out, err = generate([*base(tiny_llama), "--raw", "--prompt", "Hello world", "--quant", "8"], capsys)
    assert code == 0 and out == expected + "\n", err
    # speculation is exact: n-gram drafts give the greedy text of the same weights
    code, spec_out, err = generate([*base(tiny_llama), "--raw", "--prompt", "Hello world", "--quant", "8",
                                    "--spec-method", "ngram", "--json"], capsys)
    assert code == 0 and json.loads(spec_out)["text"] == expected, err


def test_lora_adapter_by_path_and_unknown_name(tiny_llama, capsys, tmp_path):
    from tests.lora_helpers import make_adapter

    adapter = make_adapter(tiny_llama, tmp_path / "style")
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", max_loras=1))
    eng.add_lora("style", str(adapter))
    params = SamplingParams(max_tokens=6, temperature=0.0)
    rid = eng.add_request("Hello world", params, lora_name="style")
    from engine.drive import drive

    finals = {}
    drive(eng, on_outputs=lambda outs: finals.update({o.request_id: o for o in outs}))
    code, out, err = generate([*base(tiny_llama), "--raw", "--prompt", "Hello world", "--lora",
                               f"style={adapter}", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["text"] == finals[rid].text and doc["lora"] == "style"
    code, out, err = generate([*base(tiny_llama), "--prompt", "hi", "--lora", "no-such-style"], capsys)
    assert code == 2 and "no adapter of that name" in err and err.count("inferlab: error:") == 1


def test_serve_compile_max_model_len_and_the_explorers_group_size():
    from app.server.serve import engine_config
    from app.tradeoff.sweep import SweepSpec

    cfg = engine_config(build_parser().parse_args(["serve", "--compile", "--max-model-len", "512",
                                                   "--quant-bits", "4"]))
    assert cfg.compile is True and cfg.max_model_len == 512 and cfg.quant_bits == 4
    assert cfg.quant_group_size == SweepSpec().group_size  # what the explorer measured is what serve runs
    plain = engine_config(build_parser().parse_args(["serve"]))
    assert plain.compile is False and plain.max_model_len is None


def test_serve_chat_template_file(tiny_llama, tmp_path):
    from app.server.serve import read_chat_template

    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}<<{{ m['role'] }}:{{ m['content'] }}>>{% endfor %}", encoding="utf-8")
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32"))
    eng.tokenizer.set_chat_template(read_chat_template(str(f)))
    assert eng.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "<<user:hi>>"
    with pytest.raises(ValueError, match="--chat-template"):
        read_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="does not compile"):
        eng.tokenizer.set_chat_template("{% for %}")
    assert eng.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "<<user:hi>>"  # kept


def _options(parser: argparse.ArgumentParser, path: str = "inferlab"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif action.option_strings:
            yield path, action


def test_every_help_shows_its_defaults():
    missing = []
    for path, action in _options(build_parser()):
        value = action.default
        switch = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction))
        if switch or value in (None, argparse.SUPPRESS, []):
            continue
        if "default" not in (action.help or "").lower():
            missing.append(f"{path} {action.option_strings[0]}")
    assert not missing, missing
    text = build_parser()._subparsers._group_actions[0].choices["tune"].format_help()
    assert "(default: 1 4 8)" in " ".join(text.split())
