"""The command line (issue 12, point 9: untested before): `generate` flags reach the sampling parameters
and the engine (the text equals the engine's own for the same settings), bad flag values are one error
line, `serve` flags become the engine's settings, and $INFERLAB_API_KEY is the default API key."""
from __future__ import annotations

import pytest

from app.cli import build_parser, main
from engine import EngineConfig, LLMEngine, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32"))


def generate(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("flags, params", [
    (["--temperature", "0"], SamplingParams(max_tokens=7, temperature=0.0)),
    (["--temperature", "0.9", "--top-p", "0.8", "--top-k", "20", "--seed", "11"],
     SamplingParams(max_tokens=7, temperature=0.9, top_p=0.8, top_k=20, seed=11)),
], ids=["greedy", "seeded-sampling"])
def test_generate_flags_reach_the_engine(tiny_llama, engine, capsys, flags, params):
    code, out, err = generate(["--model", str(tiny_llama), "--dtype", "float32", "--raw",
                               "--prompt", "Hello world", "--max-tokens", "7", "--stats", *flags], capsys)
    assert code == 0, err
    expected = engine.generate(["Hello world"], params)[0]
    assert out == expected.text + "\n"
    assert f"[{len(expected.token_ids)} tokens, finish={expected.finish_reason}, TTFT" in err


def test_generate_stop_string_and_chat_template(tiny_llama, engine, capsys):
    full = engine.generate(["Hello world"], SamplingParams(max_tokens=12, temperature=0.0))[0].text
    stop = next(full[i : i + 2] for i in range(1, len(full) - 1) if full[i : i + 2].isalnum())
    code, out, _ = generate(["--model", str(tiny_llama), "--dtype", "float32", "--raw", "--prompt",
                             "Hello world", "--max-tokens", "12", "--stop", stop], capsys)
    assert code == 0 and out == full[: full.index(stop)] + "\n"
    # the tiny model has a chat template: by default the prompt goes through it, --raw sends it as it is
    templated = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Hello world"}])
    chat = engine.generate([templated], SamplingParams(max_tokens=5, temperature=0.0))[0].text
    code, out, _ = generate(["--model", str(tiny_llama), "--dtype", "float32", "--prompt", "Hello world",
                             "--max-tokens", "5"], capsys)
    assert code == 0 and out == chat + "\n"


@pytest.mark.parametrize("flags, says", [
    (["--temperature", "-1"], "temperature"), (["--top-p", "0"], "top_p"), (["--top-k", "-3"], "top_k"),
    (["--seed", str(2**64)], "seed"), (["--max-tokens", "0"], "max_tokens"),
    (["--max-tokens", "100000"], "context length"),
])
def test_generate_bad_values_are_one_error_line(tiny_llama, capsys, flags, says):
    code, out, err = generate(["--model", str(tiny_llama), "--dtype", "float32", "--prompt", "hi", *flags], capsys)
    assert code == 2 and out == ""
    assert err.count("inferlab: error:") == 1 and says in err and "Traceback" not in err


def test_serve_flags_become_engine_settings():
    from app.server.serve import engine_config

    args = build_parser().parse_args(["serve", "--model", "m", "--max-num-seqs", "7", "--max-num-batched-tokens",
                                      "96", "--no-chunked-prefill", "--policy", "priority", "--max-queue-len", "5",
                                      "--max-predicted-wait", "2.5", "--kv-cache-mib", "3", "--dtype", "float32",
                                      "--threads", "2"])
    cfg = engine_config(args)
    assert (cfg.model, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.enable_chunked_prefill, cfg.policy) == (
        "m", 7, 96, False, "priority")
    assert (cfg.max_queue_len, cfg.max_predicted_wait_s, cfg.kv_cache_memory_bytes) == (5, 2.5, 3 * 2**20)
    assert (cfg.dtype, cfg.num_threads) == ("float32", 2)
    defaults = engine_config(build_parser().parse_args(["serve"]))
    assert defaults.max_queue_len is None and defaults.enable_chunked_prefill and defaults.policy == "fcfs"


def test_api_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("INFERLAB_API_KEY", "from-env")
    assert build_parser().parse_args(["serve"]).api_key == "from-env"
    assert build_parser().parse_args(["serve", "--api-key", "flag"]).api_key == "flag"
    monkeypatch.delenv("INFERLAB_API_KEY")
    assert build_parser().parse_args(["serve"]).api_key is None


def bench(args: list[str], tiny_llama, tmp_path):
    """`inferlab bench ...` in a subprocess (it sets torch's thread count for the whole process)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "app.cli", "bench", *args, "--model", str(tiny_llama), "--dtype",
                          "float32", "--threads", "1", "--json", str(out)], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).resolve().parents[1])
    return run, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.slow
def test_bench_decode_and_quant_write_their_json(tiny_llama, tmp_path):
    run, result = bench(["decode", "--max-tokens", "4", "--prompt-tokens", "8", "--rounds", "1", "--no-llama-cpp"],
                        tiny_llama, tmp_path)
    assert run.returncode == 0, run.stderr
    assert result["benchmark"] == "decode" and result["threads"] == 1 and result["max_tokens"] == 4
    assert {"inferlab", "inferlab_compile"} <= set(result)
    # the CPU it ran on, the roofline share of each side, and why llama.cpp is not in it
    cpu = result["cpu"]
    assert cpu["model"] and isinstance(cpu["flags"], list) and set(cpu["isa"]) >= {"avx2", "avx512_bf16", "amx_bf16"}
    roof = result["roofline"]
    assert roof["bytes_per_token"] > roof["weight_bytes_per_token"] > 0 and roof["probed_bandwidth_bytes_per_s"] > 0
    assert set(roof["fraction_of_probed_bandwidth"]) == {"eager", "compile"}
    for mode, rate in roof["achieved_bandwidth_bytes_per_s"].items():
        assert rate == pytest.approx(roof["fraction_of_probed_bandwidth"][mode] * roof["probed_bandwidth_bytes_per_s"])
    assert result["llama_cpp"] == {"skipped": "--no-llama-cpp"}
    run, result = bench(["quant", "--quant-format", "bf16", "fp8-e4m3", "--streams", "2", "--max-tokens", "4",
                         "--memory-budget-mib", "64"], tiny_llama, tmp_path)
    assert run.returncode == 0, run.stderr
    assert result["benchmark"] == "quant" and result["memory_budget_mib"] == 64
    q16, q8 = result["results"]["bf16"], result["results"]["fp8-e4m3"]  # the quality figures every format gets
    assert q8["weights_bytes"] < q16["weights_bytes"] and q8["kv_blocks"] >= q16["kv_blocks"]  # bytes buy KV
    assert q16["kl_divergence"] == 0.0 and 0 < q8["kl_divergence"] and q8["greedy_agreement"] <= 1.0


@pytest.mark.slow
def test_bench_whose_workload_does_not_fit_is_one_error_line(tiny_llama, tmp_path):
    run, result = bench(["throughput", "--num-chats", "2", "--num-docs", "1", "--kv-cache-mib", "8"], tiny_llama,
                        tmp_path)
    assert run.returncode == 2 and result is None
    assert "inferlab: error: bench throughput: " in run.stderr and "context length" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.slow
def test_train_mtp_saves_heads_the_engine_loads(tiny_llama, tmp_path):
    """`inferlab train-mtp` end to end (a subprocess: it sets torch's threads): its heads file loads as
    the engine's MTP proposer and speculation with it keeps greedy output exact."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    heads, text = tmp_path / "heads.safetensors", tmp_path / "text.json"

    def train(*extra):
        run = subprocess.run([sys.executable, "-m", "app.cli", "train-mtp", "--model", str(tiny_llama), "--dtype",
                              "float32", "--threads", "1", "--heads", "2", "--prompts", "3", "--max-tokens", "8",
                              "--epochs", "1", "--out", str(heads), *extra], capture_output=True, text=True,
                             timeout=300, cwd=Path(__file__).resolve().parents[1])
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout), run.stderr

    report, _ = train("--self-prompts", "2", "--sequential", "--text", str(text))
    assert report["sequential"] and report["self_prompts"] == 2 and text.is_file()
    report, log = train("--self-prompts", "2", "--text", str(text))  # the kept text, independent heads this time
    assert "reusing the" in log and not report["sequential"]
    assert report["num_heads"] == 2 and report["path"] == str(heads) and heads.is_file()
    plain = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32"))
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", spec_method="mtp",
                                 num_speculative_tokens=2, mtp_heads=str(heads)))
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    assert eng.proposer.name == "mtp"
    assert eng.generate([[5, 6, 7, 8]], params)[0].token_ids == plain.generate([[5, 6, 7, 8]], params)[0].token_ids


@pytest.mark.parametrize("flag, value", [("--prompts", "-3"), ("--epochs", "0"), ("--heads", "9"), ("--lr", "nan"),
                                         ("--self-prompts", "-1"), ("--max-tokens", "x")])
def test_train_mtp_refuses_numbers_that_would_train_nothing_or_read_past_the_prompts(flag, value, capsys):
    """A negative prompt count sliced the list from its end, and 0 epochs saved untrained heads after
    minutes of writing: argparse refuses them at once, naming the flag."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["train-mtp", flag, value])
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err


def test_ctrl_c_ends_a_command_with_one_line_not_a_traceback(monkeypatch, capsys):
    """Ctrl+C during `inferlab generate` printed a KeyboardInterrupt traceback from inside the fused step."""
    import app.generate
    from app.cli import main

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(app.generate, "run_generate", interrupted)
    assert main(["generate", "--prompt", "hi"]) == 130
    err = capsys.readouterr().err
    assert "inferlab: generate interrupted" in err and "Traceback" not in err
