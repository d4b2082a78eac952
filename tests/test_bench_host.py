"""`inferlab bench host` (issue 46, point 4): the engine's host work a decode step with the model made free."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.bench import host_bench
from engine import EngineConfig, LLMEngine, SamplingParams


def test_noop_model_skips_the_layers_and_the_sampler_still_runs(tiny_llama):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, fused_decode=False))
    calls = []
    for layer in engine.model.layers:
        layer.register_forward_hook(lambda *a: calls.append(1))
    hot = 7
    noop = host_bench.NoOpModel(engine, 64, hot)
    out = engine.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    assert calls == []  # no layer ran
    assert out.token_ids == (hot,) * 4  # greedy read the fixed logits' one hot entry
    assert noop.logits.shape == (64, engine.model_config.vocab_size)
    sampled = engine.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=16, temperature=5.0, seed=3,
                                                             ignore_eos=True))[0]
    assert len(set(sampled.token_ids)) > 1  # sampling drew from the whole row, not only the hot entry
    parts = host_bench.timed_sections(engine, [[5, 6, 7, 8]], SamplingParams(temperature=0.0), 3)
    assert parts["forward (the no-op)"] > 0 and parts["schedule"] > 0
    # every timer is gone again: the class's methods, the no-op, the runner module's function
    assert "_step" not in vars(engine) and "schedule" not in vars(engine.scheduler)
    assert engine.model.forward == noop.forward and "execute" not in vars(engine.runner)
    from engine.runner import model_runner, step_result
    assert model_runner.read_back_step is step_result.read_back_step


def test_generated_streams_reach_the_timed_steps_with_that_many_tokens(tiny_llama):
    """--generated N: each stream's answer is N tokens long before the timing starts (a long answer's per-step
    costs), and the KV cache the bench sizes holds it."""
    args = SimpleNamespace(streams=[3], prompt_tokens=4, generated=40, steps=3, model=str(tiny_llama),
                           dtype="float32", threads=1, device="cpu")
    engine = host_bench.host_engine(args)
    host_bench.NoOpModel(engine, engine.config.max_num_batched_tokens, 7)
    ids = host_bench._start(engine, [[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]], SamplingParams(), 3,
                            args.generated)
    running = engine.scheduler.running
    assert sorted(r.request_id for r in running) == sorted(ids) and not engine.scheduler.waiting
    assert all(r.num_output_tokens == 40 and r.num_computed_tokens == r.num_tokens - 1 for r in running)
    host_bench._finish(engine, ids)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.slow
def test_bench_host_writes_its_json(tiny_llama, tmp_path):
    out = tmp_path / "host.json"
    run = subprocess.run([sys.executable, "-m", "app.cli", "bench", "host", "--streams", "1", "3", "--steps", "3",
                          "--rounds", "2", "--prompt-tokens", "4", "--model", str(tiny_llama), "--dtype", "float32",
                          "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    result = json.loads(out.read_text()) if out.exists() else None
    assert run.returncode == 0, run.stderr
    assert result["benchmark"] == "host" and result["threads"] == 1 and "lm_head" in result["noop_replaced"]
    assert len(result["load_average_each_round"]) == 3  # before the rounds and after each
    for mode in ("greedy", "sampled"):
        one, three = result["us_per_step"][mode]["1"], result["us_per_step"][mode]["3"]
        assert len(one["each_round"]) == len(one["cpu_each_round"]) == 2 and one["median"] > 0 and three["median"] > 0
        assert 0 < one["cpu_median"] and one["cpu_meets_target"] == (one["cpu_median"] <= 150.0)
        assert one["target"] == 150.0 and one["meets_target"] == (one["median"] <= 150.0)
        assert three["tokens_per_s_ceiling"] == pytest.approx(3e6 / three["median"], rel=1e-3)
        breakdown = result["breakdown"][f"{mode} 3 streams"]
        parts = breakdown["cpu_us_per_step"]
        assert set(parts) == {label for _, _, label in host_bench.SECTIONS}  # every part found and timed
        assert all(v > 0 for v in parts.values())
        whole = parts.pop("step (all of it)")
        assert whole >= parts["execute (runner)"] + parts["schedule"] + parts["publish (stats, event)"]
        assert breakdown["most_own_time_under_cprofile"][0]["own_us_per_step"] > 0


def test_each_step_is_also_timed_less_its_pass_over_the_logits(tiny_llama_hd64):
    """bf16 with the native decode attention: the sampler's rows kernel is timed inside each step (TimedRows),
    each step's host work (the GPU path's: the pass is device work there) is the step less that, and the
    runner gets its own kernel back afterwards."""
    args = SimpleNamespace(streams=[2], prompt_tokens=4, generated=0, steps=4, model=str(tiny_llama_hd64),
                           dtype="bfloat16", threads=1, device="cpu")
    engine = host_bench.host_engine(args)
    kernel = engine.runner.rows_kernel
    if kernel is None:
        pytest.skip("no native kernels built here")
    host_bench.NoOpModel(engine, engine.config.max_num_batched_tokens, 7)
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8)):
        wall, cpu, host = host_bench.timed_steps(engine, [[5, 6, 7, 8], [9, 10, 11, 12]], params, 4)
        assert len(wall) == len(cpu) == len(host) == 4
        assert all(0 < h < w for h, w in zip(host, wall))  # the pass took some of each step, not all of it
        assert engine.runner.rows_kernel is kernel
    row = host_bench._row(1, [100.0, 120.0], [90.0, 110.0], [80.0, 95.0])
    assert row["host_median"] == 87.5 and row["host_meets_target"] and row["host_each_round"] == [80.0, 95.0]
    assert "host_median" not in host_bench._row(1, [100.0], [90.0], None)  # torch's ops: not split off
