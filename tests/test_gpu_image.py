"""The GPU day's check on exactly what the lent image holds (no Qt, no FastAPI, no platformdirs, no gguf),
and the options it measures: --cuda-graphs everywhere, the graphs mode of the benches."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(600)  # the dry run's budget (400 s) and the recording's replay, over the suite's 300 s
def test_the_dry_run_in_the_gpu_images_packages_brings_every_result_back(tmp_path):
    """A venv with only the image's packages (this machine's CPU torch standing in for its CUDA torch):
    every step writes its result with figures; none fails on a missing package; the screenshot, which
    needs the GUI stack the image lacks, is skipped, saying so."""
    from image_venv import build_image_venv

    try:
        python = build_image_venv(tmp_path / "venv")
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"no venv of the image's packages can be built offline here: {e}")
    out, work = tmp_path / "out", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out), "--work", str(work),
                           "--budget-s", "400"], env={**env, "PYTHON": str(python)},
                          capture_output=True, text=True, timeout=420)
    results = json.loads((out / "results.json").read_text())
    steps = {s["name"]: s for s in results["steps"]}
    logs = {n: s["log_tail"][-800:] for n, s in steps.items()}
    assert proc.returncode == 0 and results["ok"], (proc.stderr[-1500:], logs)
    assert not [n for n, text in logs.items() if "ModuleNotFoundError" in text], logs
    assert steps["screenshot"]["missing_packages"] == ["PySide6", "pyqtgraph", "qasync"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["results.json", "environment.json", "cuda_tests.xml", "bench_decode.json", "bench_hf.json",
         "graphs_startup.json", "run.inferlab-run"])
    missing = json.loads((out / "environment.json").read_text())["missing_packages"]
    assert {"PySide6", "platformdirs", "gguf", "fastapi"} <= set(missing) and "torch" not in missing
    assert "triton" not in missing  # the image has Triton: the CUDA path's kernels
    assert [s["name"] for s in results["steps"]] == ["environment", "bench_decode", "bench_hf", "graphs_startup",
                                                     "cuda_tests", "bench_host", "flex", "screenshot"]  # figures first
    host = steps["bench_host"]["result"]  # folded into results.json: the host time a step, with the model a no-op
    assert host["benchmark"] == "host" and host["device"] == "cpu"
    assert all(row["median"] > 0 for mode in ("greedy", "sampled") for row in host["us_per_step"][mode].values())
    ours = json.loads((out / "bench_decode.json").read_text())
    assert ours["device"] == "cpu" and ours["engine"]["triton_kernels"] and ours["finished"]  # the interpreter
    for streams in ("1_streams", "2_streams"):
        assert set(ours["decode"][streams]) == {"eager", "graphs"}
        assert all(m["median_tokens_per_s"] > 0 for m in ours["decode"][streams].values())
    launches = ours["profile"]["graphs"]["launches_counted_from_the_code"]
    assert launches["by_kernel"]["triton:sample"] == 1 and launches["total"] > 0
    assert ours["memory"]["weights_bytes"] > 0 and ours["memory"]["kv_blocks_total"] > 0
    assert json.loads((out / "bench_hf.json").read_text())["hf"]["eager_dynamic_cache"]
    startup = json.loads((out / "graphs_startup.json").read_text())  # built at engine build, before the KV sizing
    assert startup["kv_sizing"]["order"] == ["graphs", "kv"] and startup["kv_sizing"]["kv_blocks"] > 0
    assert startup["startup"]["buckets"] and startup["startup"]["pool_bytes"] == 0  # the CPU: nothing captured
    assert startup["graphs_bytes_at_capture_minus_before_kv"] == 0
    assert startup["decode"]["steps_in_graph_buffers"] > 0 and startup["decode"]["tokens_match_graphs_off"]
    assert "skipped" in steps["cuda_tests"]["log_tail"]
    assert steps["bench_decode"]["files"] == ["bench_decode.json", "run.inferlab-run"]
    _the_recording_replays(out / "run.inferlab-run", ours["recording"], tmp_path)


def _the_recording_replays(path: Path, said: dict, tmp_path: Path) -> None:
    """The GPU check's recording (gzip: the image has no zstandard), made without Qt, plays here: its decode
    runs and its serving run with n-gram drafts, step for step, and the app draws its panels from it."""
    from app.record.reader import open_recording
    from app.source import channel
    from engine.events import EngineStepEvent

    assert path.read_bytes()[:2] == b"\x1f\x8b" and said["dropped"] == 0
    with open_recording(path) as rec:
        items = [item for _t, item in rec.items()]
        assert rec.cut_short is None and rec.header["panels"] == ["memory", "timeline", "spec"]
    runs = [i.text for i in items if isinstance(i, channel.Message)]
    assert runs == [f"recorded run: decode, {n} streams, graphs" for n in (1, 2)] + [
        "recorded run: serving: 3 requests arriving over a second, n-gram drafts of 4"]
    steps = [i for i in items if isinstance(i, EngineStepEvent)]
    assert sum(len(s.finished) for s in steps) == 1 + 2 + 3  # every request of every recorded run
    assert any(s.spec is not None for s in steps)  # the serving run's drafting steps
    shot = tmp_path / "replay.png"
    proc = subprocess.run([sys.executable, "-m", "app.cli", "--replay", str(path), "--speed", "4", "--screenshot",
                           str(shot), "--size", "1280x720", "--run-seconds", "30"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert proc.returncode == 0 and shot.stat().st_size > 10_000, proc.stderr[-1500:]


def test_the_cache_and_data_folders_need_no_platformdirs(monkeypatch, tmp_path):
    """Without platformdirs (the lent image) the folders are the XDG ones it would have named on Linux."""
    from engine.loading.loader import cache_root
    from engine.loading.user_dirs import user_dir

    monkeypatch.setitem(sys.modules, "platformdirs", None)  # `import platformdirs` raises ImportError
    monkeypatch.delenv("INFERLAB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert cache_root() == tmp_path / "cache" / "inferlab"
    assert user_dir("data") == tmp_path / "data" / "inferlab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert user_dir("cache") == Path.home() / ".cache" / "inferlab"
    with pytest.raises(ValueError, match="cache' or 'data"):
        user_dir("config")


def test_a_module_that_needs_a_missing_gui_package_is_skipped_not_an_error():
    from optional_stacks import missing_optional

    assert missing_optional("E   ModuleNotFoundError: No module named 'PySide6.QtCore'") == "PySide6"
    assert missing_optional("E   ModuleNotFoundError: No module named 'uvicorn'") == "uvicorn"
    assert missing_optional("E   ModuleNotFoundError: No module named 'torch'") is None  # a real failure stays one
    assert missing_optional("E   SyntaxError: invalid syntax") is None


@pytest.mark.parametrize("argv", [["bench", "decode"], ["bench", "throughput"], ["generate", "--prompt", "hi"],
                                  ["serve"], []])
def test_every_engine_command_and_the_app_take_cuda_graphs(argv):
    from app.cli import build_parser
    from app.device_args import device_options

    parser = build_parser()  # no subcommand: the desktop app
    assert device_options(parser.parse_args([*argv, "--cuda-graphs"]))["cuda_graphs"] is True
    assert device_options(parser.parse_args(argv))["cuda_graphs"] is None  # on where the engine runs on CUDA
    assert device_options(parser.parse_args([*argv, "--no-cuda-graphs"]))["cuda_graphs"] is False


def test_graphs_switch_on_and_off_at_run_time_with_the_same_tokens(tiny_llama):
    """The benches' graphs mode: reconfigure(cuda_graphs=...) between rounds; the static-buffer steps
    (uncaptured on the CPU) give the ordinary path's tokens, and switching off drops them."""
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", attention_backend="fast", num_kv_blocks=32))
    want = [o.token_ids for o in eng.generate(["Hello there", "a"], params)]
    assert eng.runner.graphs is None
    eng.reconfigure(cuda_graphs=True)
    assert [o.token_ids for o in eng.generate(["Hello there", "a"], params)] == want
    assert eng.runner.graphs is not None and eng.runner.graphs.num_runs >= 10 and eng.config.cuda_graphs
    eng.reconfigure(cuda_graphs=False)
    assert [o.token_ids for o in eng.generate(["Hello there", "a"], params)] == want
    assert eng.runner.graphs is None


def test_graphs_stay_with_an_idle_lora_pool(tiny_llama, tmp_path):
    """An engine with an adapter pool runs its base-only decode steps through the graphs' buffers (the
    unbound LoRA layers add nothing); a step with an adapter row takes the ordinary path, and the graphs
    built so far are kept: the next base-only steps run through them again."""
    from lora_helpers import make_adapter

    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    kw = dict(model=str(tiny_llama), dtype="float32", attention_backend="fast", num_kv_blocks=64, max_loras=2)
    plain = LLMEngine(EngineConfig(**kw))
    graphs = LLMEngine(EngineConfig(**kw, cuda_graphs=True))
    adapter = make_adapter(tiny_llama, tmp_path / "adapter")
    for eng in (plain, graphs):
        eng.add_lora("a", str(adapter))
    assert [o.token_ids for o in graphs.generate(["Hello there", "a"], params)] == \
        [o.token_ids for o in plain.generate(["Hello there", "a"], params)]
    base_runs = graphs.runner.graphs.num_runs
    assert base_runs >= 9
    with_adapter = graphs.generate(["Hello there"], params, lora_names=["a"])[0].token_ids
    assert with_adapter == plain.generate(["Hello there"], params, lora_names=["a"])[0].token_ids
    kept = graphs.runner.graphs
    assert kept.num_runs == base_runs  # adapter rows never go through the graphs
    built = kept.built_buckets()
    assert set(kept.startup_buckets) <= set(built)
    assert graphs.generate(["Hello there"], params)[0].token_ids == plain.generate(["Hello there"], params)[0].token_ids
    assert graphs.runner.graphs is kept and kept.built_buckets()[: len(built)] == built  # nothing dropped
    assert kept.num_runs > base_runs


def test_a_peer_whose_gguf_cannot_be_made_is_skipped_not_fatal(monkeypatch, tmp_path):
    """bench decode's llama.cpp peer: a failed GGUF conversion is said in the results; the bench goes on."""
    from argparse import Namespace

    from app.bench import cli, llama_cpp

    def no_gguf(model_path, fmt):
        raise ValueError("convert_hf_to_gguf.py failed: no sentencepiece")

    monkeypatch.setattr(llama_cpp, "find_binary", lambda: tmp_path / "llama-bench")
    monkeypatch.setattr(llama_cpp, "gguf_for_format", no_gguf)
    engine = Namespace(model_path=str(tmp_path))
    peer, info = cli._llama_cpp_peer(Namespace(no_llama_cpp=False), engine, 16)
    assert peer is None and "sentencepiece" in info["skipped"]
