"""Multi-LoRA: PEFT adapters load and are checked against the base; a mixed batch (base + adapters) gives
each row the tokens transformers + peft give that adapter alone; the pool evicts under load and loses
nothing; the prefix cache never shares blocks between adapters."""
from __future__ import annotations

import json

import pytest
import torch
from lora_helpers import hf_greedy, make_adapter

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.lora.adapter import LoraLoadError

PROMPTS = [[5, 17, 42, 99, 7, 250, 3, 64], [11, 300, 21, 8, 77, 91, 150, 33, 12], [200, 45, 6, 19, 88]]


@pytest.fixture(scope="module")
def adapters(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    return {
        "all": make_adapter(tiny_llama, root / "all", rank=4, alpha=8, seed=1),
        "qv-down-rs": make_adapter(tiny_llama, root / "qvd", rank=8, alpha=16, seed=2, rslora=True,
                                   targets=["q_proj", "v_proj", "down_proj"]),
        "mlp": make_adapter(tiny_llama, root / "mlp", rank=2, alpha=4, seed=3, targets=["gate_proj", "up_proj"]),
        "r16": make_adapter(tiny_llama, root / "r16", rank=16, alpha=16, seed=4, targets=["o_proj"]),
    }


def engine(base, max_loras=2, **kw):
    cfg = dict(model=str(base), dtype="float32", num_kv_blocks=96, block_size=4, max_loras=max_loras,
               max_lora_rank=8)
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg))


def test_mixed_batch_equals_transformers_peft_per_row(tiny_llama, adapters):
    """One batch: base, adapter 'all' and adapter 'qv-down-rs' (rsLoRA) rows side by side; every row
    greedy-decodes what HF transformers + peft give with that adapter alone, and the adapters change it."""
    eng = engine(tiny_llama)
    eng.add_lora("all", adapters["all"])
    eng.add_lora("qvd", adapters["qv-down-rs"])
    names = [None, "all", "qvd"] * 3  # every prompt with every adapter, interleaved in one batch
    prompts = [PROMPTS[(i + i // 3) % 3] for i in range(9)]
    outs = eng.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0), lora_names=names)
    paths = {None: None, "all": adapters["all"], "qvd": adapters["qv-down-rs"]}
    refs = {}
    for prompt, name, out in zip(prompts, names, outs):
        key = (tuple(prompt), name)
        refs.setdefault(key, hf_greedy(tiny_llama, prompt, 10, paths[name]))
        assert list(out.token_ids) == refs[key], (name, prompt)
        assert out.lora_name == name
    for p in PROMPTS:  # the adapters really change the greedy path
        assert refs[(tuple(p), None)] != refs[(tuple(p), "all")] != refs[(tuple(p), "qvd")]


def test_batched_update_equals_per_row_reference(tiny_llama, adapters):
    """The grouped products (rows indexed by slot) equal B(Ax) computed one row at a time."""
    from engine.lora.layer import lora_delta_reference

    eng = engine(tiny_llama)
    eng.add_lora("all", adapters["all"])
    eng.add_lora("mlp", adapters["mlp"])
    eng.generate([PROMPTS[0]] * 2, SamplingParams(max_tokens=1), lora_names=["all", "mlp"])  # loads both
    pool = eng.lora
    wrapper = pool.modules.wrappers[(1, "mlp.gate_up_proj")]
    x = torch.randn(7, 64)
    slots = [None, 0, 1, 0, None, 1, 1]
    pool.modules.bind([(0 if s is None else pool._slots[s].lora_id, 1) for s in slots],  # one row each
                      pool._slot_of.__getitem__)
    got = wrapper.add_updates(x, torch.zeros(7, 256))
    for i, s in enumerate(slots):
        want = torch.zeros(256)
        if s is not None:
            w = pool._slots[s].weights
            for j, t in enumerate(("gate_proj", "up_proj")):
                if (1, t) in w:
                    want[j * 128 : (j + 1) * 128] = lora_delta_reference(x[i], *w[(1, t)])
        torch.testing.assert_close(got[i], want, atol=1e-5, rtol=1e-5)


def test_quantized_base_with_adapter(tiny_llama, adapters):
    """The update wraps whatever projection is there: int8 base + adapter runs, and a requantization at
    run time keeps the adapter (the wrapper's base is swapped, not the wrapper)."""
    eng = engine(tiny_llama, dtype="bfloat16", quant_format="int8", max_loras=1)
    eng.add_lora("all", adapters["all"])
    p = SamplingParams(max_tokens=6, temperature=0.0)
    with_adapter = eng.generate([PROMPTS[0]], p, lora_names=["all"])[0].token_ids
    base = eng.generate([PROMPTS[0]], p)[0].token_ids
    assert with_adapter != base
    eng.set_quantization("int8")
    assert eng.generate([PROMPTS[0]], p, lora_names=["all"])[0].token_ids == with_adapter


def test_adapter_for_another_base_is_refused(tiny_llama, tmp_path):
    from tests.conftest import build_tiny_model

    other = build_tiny_model(tmp_path / "other", "llama", hidden_size=96, num_attention_heads=4)
    path = make_adapter(other, tmp_path / "wrong", rank=4)
    eng = engine(tiny_llama)
    with pytest.raises(LoraLoadError, match="does not fit this base model.*lora_A"):
        eng.add_lora("wrong", path)
    assert eng.list_loras() == ()
    with pytest.raises(LoraLoadError, match="no adapter_config.json"):
        eng.add_lora("nothing", tmp_path)
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(LoraLoadError, match="DoRA"):
        eng.add_lora("dora", path)


def test_rank_above_max_lora_rank_is_refused(tiny_llama, adapters):
    eng = engine(tiny_llama, max_lora_rank=8)
    with pytest.raises(LoraLoadError, match="rank 16 exceeds max_lora_rank=8"):
        eng.add_lora("r16", adapters["r16"])
    with pytest.raises(ValueError, match="unknown LoRA adapter 'r16'"):
        eng.add_request(PROMPTS[0], lora_name="r16")


def test_no_pool_refuses_adapters(tiny_llama, adapters):
    eng = engine(tiny_llama, max_loras=0)
    with pytest.raises(ValueError, match="no LoRA pool"):
        eng.add_lora("all", adapters["all"])
    with pytest.raises(ValueError, match="no LoRA pool"):
        eng.add_request(PROMPTS[0], lora_name="all")


def test_pool_eviction_under_load_loses_nothing(tiny_llama, adapters):
    """Four adapters through two device slots and two host slots (the first two added go back to disk
    at once, to be read again when needed): every
    request finishes with the tokens it gets alone, at most two adapters run in any step, loads and
    evictions are events, and every KV block comes back."""
    names = ["all", "qv-down-rs", "mlp", "all2"]
    eng = engine(tiny_llama, max_loras=2, max_cpu_loras=2, max_num_seqs=6, num_kv_blocks=64)
    for n in names:
        eng.add_lora(n, adapters.get(n, adapters["all"]))
    events, pools = [], []
    eng.add_listener(lambda e: (events.extend(e.lora_events), pools.append(e)))
    order = [names[i % 4] if i % 5 else None for i in range(16)]
    prompts = [PROMPTS[i % 3] for i in range(16)]
    p = SamplingParams(max_tokens=5, temperature=0.0)
    outs = eng.generate(prompts, p, lora_names=order)
    assert all(o.finish_reason == "length" and len(o.token_ids) == 5 for o in outs)
    alone = engine(tiny_llama, max_loras=1)
    for n in set(names):
        alone.add_lora(n, adapters.get(n, adapters["all"]))
    for prompt, name, out in zip(prompts, order, outs):
        assert list(out.token_ids) == list(alone.generate([prompt], p, lora_names=[name])[0].token_ids)
    for e in pools:
        assert len({n for n in e.stats.scheduled_loras if n}) <= 2
    kinds = [e.kind for e in events]
    assert kinds.count("load") > 2 and "evict" in kinds and "drop" in kinds
    assert {e.source for e in events if e.kind == "load"} == {"host", "disk"}
    assert eng.block_manager.num_used_blocks == 0 and not eng.has_unfinished()
    snap = pools[-1].lora_pool
    assert snap.num_loads == kinds.count("load") and snap.num_evictions == kinds.count("evict")


def test_request_waiting_for_a_slot_is_not_starved(tiny_llama, adapters):
    """One device slot, adapter "all" kept busy by a steady stream: a request of "mlp" that arrived
    before the later "all" requests is admitted once the earlier ones drain, ahead of those later ones."""
    eng = engine(tiny_llama, max_loras=1, max_num_seqs=8, num_kv_blocks=128)
    eng.add_lora("all", adapters["all"])
    eng.add_lora("mlp", adapters["mlp"])
    p = SamplingParams(max_tokens=4, temperature=0.0)
    first_token: dict[str, int] = {}
    step = 0
    for i in range(2):
        eng.add_request(PROMPTS[i], p, request_id=f"all-{i}", lora_name="all")
    eng.step()
    eng.add_request(PROMPTS[2], p, request_id="mlp", lora_name="mlp")
    later = 0
    while eng.has_unfinished() and step < 200:
        if later < 12:  # the stream to the running adapter never pauses
            eng.add_request(PROMPTS[later % 3], p, request_id=f"later-{later}", lora_name="all")
            later += 1
        for out in eng.step():
            first_token.setdefault(out.request_id, step)
        step += 1
    assert not eng.has_unfinished()
    assert "mlp" in first_token
    # every "all" request that arrived after it started after it (they waited for its slot to clear)
    assert all(first_token[f"later-{i}"] > first_token["mlp"] for i in range(later))
    assert eng.block_manager.num_used_blocks == 0


def test_prefix_cache_never_shares_blocks_between_adapters(tiny_llama, adapters):
    eng = engine(tiny_llama)
    eng.add_lora("all", adapters["all"])
    prompt = list(range(3, 3 + 17))  # four full blocks of 4
    p = SamplingParams(max_tokens=1)
    eng.generate([prompt], p)  # base: its blocks are cached
    eng.add_request(prompt, p, request_id="with-adapter", lora_name="all")
    eng.step()
    assert eng.stats().num_prefix_cache_hit_tokens == 0
    eng.generate([prompt], p, lora_names=["all"])  # the same adapter again: a hit
    assert eng.stats().num_prefix_cache_hit_tokens == 16


def test_speculative_decoding_with_adapters_is_exact(tiny_llama, adapters):
    """Verification runs every row with its request's adapter, so speculation changes nothing but speed."""
    p = SamplingParams(max_tokens=12, temperature=0.0)
    prompts = [PROMPTS[0] * 3, PROMPTS[1] * 2]
    outs = {}
    for spec in (None, "ngram"):
        eng = engine(tiny_llama, spec_method=spec, num_speculative_tokens=3 if spec else 0)
        eng.add_lora("all", adapters["all"])
        outs[spec] = [o.token_ids for o in eng.generate(prompts, p, lora_names=["all", None])]
    assert outs[None] == outs["ngram"]


def test_remove_lora_lets_queued_requests_finish(tiny_llama, adapters):
    eng = engine(tiny_llama, max_loras=1)
    eng.add_lora("all", adapters["all"])
    rid = eng.add_request(PROMPTS[0], SamplingParams(max_tokens=4), lora_name="all")
    eng.remove_lora("all")
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert [o for o in outs if o.request_id == rid][-1].finish_reason == "length"
    assert eng.list_loras() == ()
    with pytest.raises(ValueError, match="unknown LoRA adapter"):
        eng.add_request(PROMPTS[0], lora_name="all")
    eng.generate([PROMPTS[0]], SamplingParams(max_tokens=1))  # the retired adapter's slot is freed
    assert eng.lora.snapshot().device_slots == (None,)


def test_memory_counts_the_pool_and_the_kv_budget_leaves_it_out(tiny_llama, adapters):
    budget = 2**20
    plain = engine(tiny_llama, max_loras=0, num_kv_blocks=None, kv_cache_memory_bytes=budget)
    pooled = engine(tiny_llama, max_loras=4, num_kv_blocks=None, kv_cache_memory_bytes=budget)
    pool_bytes = pooled.lora.device_bytes
    assert pool_bytes > 0 and pooled.memory().lora_device_bytes == pool_bytes
    assert pooled.block_manager.num_blocks == (budget - pool_bytes) // pooled.block_bytes
    assert plain.block_manager.num_blocks == budget // plain.block_bytes
    pooled.add_lora("all", adapters["all"])
    pooled.step()
    assert pooled.memory().lora_host_bytes == pooled.list_loras()[0].nbytes


def test_written_adapter_loads_in_peft_and_merged_equals_unmerged(tiny_llama, tmp_path):
    """An adapter written by inferlab (no peft) is a PEFT folder peft reads; merged into the weights it
    gives the tokens the batched update gives."""
    from engine.lora.adapter import load_adapter
    from engine.lora.merge import merge_adapter
    from engine.lora.peft_write import random_adapter, save_peft_adapter

    unmerged = engine(tiny_llama, max_loras=1)
    weights = random_adapter(unmerged.model_config, 4, ("q_proj", "v_proj", "up_proj", "down_proj"), seed=5, std=0.3)
    path = save_peft_adapter(tmp_path / "written", weights, rank=4, alpha=8)
    unmerged.add_lora("w", path)
    p = SamplingParams(max_tokens=8, temperature=0.0)
    got = list(unmerged.generate([PROMPTS[1]], p, lora_names=["w"])[0].token_ids)
    assert got == hf_greedy(tiny_llama, PROMPTS[1], 8, path)
    merged = engine(tiny_llama, max_loras=0)
    merge_adapter(merged.model, merged.model_config,
                  load_adapter(path, "w", 1, merged.model_config, 8, torch.float32))
    assert list(merged.generate([PROMPTS[1]], p)[0].token_ids) == got


def test_base_paths_after_an_adapter_batch_see_no_adapter(tiny_llama, adapters):
    """score() (and calibration, through its own runner) after a step full of adapter rows: pure base."""
    eng = engine(tiny_llama)
    eng.add_lora("all", adapters["all"])
    eng.generate(PROMPTS[:2], SamplingParams(max_tokens=2), lora_names=["all", "all"])
    plain = engine(tiny_llama, max_loras=0)
    torch.testing.assert_close(eng.score(PROMPTS[2]), plain.score(PROMPTS[2]))


def test_compiled_engine_with_adapters_gives_the_same_tokens(tiny_llama, adapters):
    """compile=True: the LoRA update runs eager between the compiled regions (a graph break), same tokens."""
    p = SamplingParams(max_tokens=6, temperature=0.0)
    outs = []
    for compile_ in (False, True):
        eng = engine(tiny_llama, compile=compile_)
        eng.add_lora("all", adapters["all"])
        outs.append([o.token_ids for o in eng.generate(PROMPTS, p, lora_names=["all", None, "all"])])
    assert outs[0] == outs[1]
