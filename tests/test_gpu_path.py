"""The CUDA path as a whole (attention_backend "triton", the default on CUDA: engine/kernels/gpu), run on the CPU
under Triton's interpreter (tests/triton_setup.py): the same tokens as the reference path, with CUDA graphs'
static buffers (uncaptured here) and without, over chunked and cached prompts, bias and q/k-norm models,
speculative verifies; a non-finite row fails alone; and a decode step's launches, counted from the code,
held to the issue's budget: at most 12 kernels a layer and 15 around them."""
from __future__ import annotations

import math

import pytest
from triton_setup import DEVICE, needs_triton

from engine import EngineConfig, LLMEngine, SamplingParams

pytestmark = [needs_triton, pytest.mark.filterwarnings("ignore::UserWarning")]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
# a prompt of several chunks (max_num_batched_tokens 16), one that shares its first block with it (a prefix hit)
PROMPTS = ["The quick brown fox jumps over", "The quick brown fox sleeps", "A"]


def _engine(model, backend="triton", **kw) -> LLMEngine:
    kw = dict(dict(model=str(model), device=DEVICE, dtype="float32", attention_backend=backend, num_kv_blocks=64,
                   max_num_seqs=4, max_num_batched_tokens=16), **kw)
    return LLMEngine(EngineConfig(**kw))


def _tokens(eng, params=GREEDY, prompts=PROMPTS):
    return [o.token_ids for o in eng.generate(prompts, params)]


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_qwen2", "tiny_qwen3", "tiny_tied"])
def test_the_triton_path_gives_the_reference_tokens(request, fixture):
    model = request.getfixturevalue(fixture)
    eng = _engine(model)
    assert eng.runner.backend.triton is not None
    assert _tokens(eng) == _tokens(_engine(model, "reference"))


def test_graphs_static_buffers_give_the_same_tokens_and_are_built_at_start_up(tiny_llama):
    eng = _engine(tiny_llama, cuda_graphs=True)
    graphs = eng.runner.graphs
    built = graphs.built_buckets()
    # every batch bucket up to max_num_seqs, at the one context bucket of max_model_len (256 tokens: 16 blocks)
    assert built == [(1, 16), (2, 16), (4, 16)] and graphs.startup_buckets == built
    assert _tokens(eng) == _tokens(_engine(tiny_llama, "reference"))
    assert graphs.num_runs > 0 and graphs.built_buckets() == built  # no bucket made while serving


def test_graphs_switched_off_and_on_are_kept_not_rebuilt(tiny_llama):
    """A bench alternating eager and graphs rounds: switching graphs off keeps them, switching on serves the
    same ones (on a GPU: no capture inside a measured round)."""
    eng = _engine(tiny_llama, cuda_graphs=True)
    graphs = eng.runner.graphs
    eng.reconfigure(cuda_graphs=False)
    want = _tokens(eng)
    assert eng.runner.graphs is None
    eng.reconfigure(cuda_graphs=True)
    assert _tokens(eng) == want and eng.runner.graphs is graphs  # (a reconfigure applies at the next step)


def test_ngram_verifies_run_through_the_prefill_kernel(tiny_llama):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = ["a b c a b c a b c a b", "x y x y x y"]
    spec = _engine(tiny_llama, spec_method="ngram", num_speculative_tokens=3)
    events = []
    spec.add_listener(events.append)
    assert _tokens(spec, params, prompts) == _tokens(_engine(tiny_llama, "reference"), params, prompts)
    assert sum(e.spec.num_verify_passes for e in events if e.spec is not None) > 0


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_nonfinite_row_fails_its_request_alone(tiny_llama, value):
    from test_request_failure import PROMPTS as IDS
    from test_request_failure import poison_logits, run

    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    clean = run(_engine(tiny_llama, block_size=4), params)[0]
    eng = _engine(tiny_llama, block_size=4)
    poison_logits(eng, value)
    outs, _ = run(eng, params)
    assert outs[1].finish_reason == "error" and "non-finite" in outs[1].error and outs[1].token_ids == ()
    assert [outs[i].token_ids for i in (0, 2, 3)] == [clean[i].token_ids for i in (0, 2, 3)]
    assert eng.block_manager.num_used_blocks == 0 and len(IDS) == 4


def _decode_step_launches(tmp_path, layers: int, **kw) -> dict:
    from engine.kernels.gpu.launches import counting
    from tests.conftest import build_tiny_model

    model = build_tiny_model(tmp_path / f"layers-{layers}", "llama", num_hidden_layers=layers)
    eng = _engine(model, **kw)
    for prompt in ("Hello there", "A"):
        eng.add_request(prompt, GREEDY)
    for _ in range(3):  # both prompts in, decoding
        eng.step()
    with counting() as count:
        eng.step()
    assert eng.runner.last_path is not None
    return count.kernels


@pytest.mark.parametrize("graphs", [True, False])
def test_a_decode_step_launches_at_most_12_kernels_a_layer_and_15_around(tmp_path, graphs):
    """Counted from the code that runs on CUDA (engine/kernels/gpu/launches.py: each Triton kernel and each
    torch op that launches one, and each copy between host and device), in bf16 as a GPU runs it: one and two
    layers give the per-layer count and the rest. With graphs, the layers' kernels are one replay's."""
    # the CPU's own weight-streaming kernel off: the library products, as on CUDA
    one = _decode_step_launches(tmp_path, 1, dtype="bfloat16", cuda_graphs=graphs, stream_linear=False)
    two = _decode_step_launches(tmp_path, 2, dtype="bfloat16", cuda_graphs=graphs, stream_linear=False)
    per_layer = sum(two.values()) - sum(one.values())
    around = sum(one.values()) - per_layer
    assert per_layer <= 12 and around <= 15, (per_layer, around, dict(one))
    assert one["triton:sample"] == 1 and one["copy:read_back"] == 1  # one sampling kernel, one read-back
    layer = {k: two[k] - one.get(k, 0) for k in two if two[k] != one.get(k, 0)}
    assert layer == {"triton:add_rms_norm": 2, "triton:rope_and_cache": 1, "triton:paged_decode": 1,
                     "triton:silu_and_mul": 1, "torch:linear": 4}
