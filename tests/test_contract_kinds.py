"""Kinds in the contracts are str-valued enums (engine/events.py): the engine emits members, which still
equal their strings and encode to them in JSON, so readers of either spelling keep working."""
from __future__ import annotations

import json

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.events import ForwardPath, LoraEventKind, SpecMethod, StepKind
from engine.knobs import KNOB

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def test_step_kinds_and_forward_path_are_enum_members(tiny_llama):
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4))
    seen: list = []
    eng.add_listener(lambda event: seen.append(event.stats))
    eng.add_request([5, 6, 7, 8], GREEDY)
    while eng.has_unfinished():
        eng.step()
    kinds = [kind for stats in seen for _rid, _n, kind in stats.scheduled]
    assert kinds[0] is StepKind.PREFILL and StepKind.DECODE in kinds
    assert all(isinstance(k, StepKind) for k in kinds) and kinds[0] == "prefill"
    assert all(isinstance(stats.forward_path, ForwardPath) for stats in seen)
    assert json.loads(json.dumps([kinds[0], seen[0].forward_path])) == ["prefill", str(seen[0].forward_path)]


def test_enum_members_read_as_their_strings():
    assert f"{StepKind.VERIFY}" == "verify" and str(LoraEventKind.EVICT) == "evict"
    assert not ForwardPath.NONE and ForwardPath.FUSED == "fused"  # "" stays falsy: `path or "-"` still reads
    assert "mtp" in KNOB["spec_method"].choices and SpecMethod("ngram") is SpecMethod.NGRAM


def test_the_config_stores_each_kind_as_its_member_and_writes_the_same_strings():
    """A knob whose values are a kind (engine/knobs.KIND_KNOBS) is stored as its enum member whatever spelling
    came in (a preset's TOML, a CLI flag, JSON), so the engine compares members, not strings."""
    from engine.config import SchedulerConfig
    from engine.events import AttentionBackendName, KernelBuild, KvCacheDtype, SchedulingPolicy
    from engine.knobs import KIND_KNOBS

    assert set(KIND_KNOBS) == {"policy", "spec_method", "attention_backend", "kv_cache_dtype", "kernel_build"}
    config = EngineConfig(spec_method="ngram", policy="spf", attention_backend="fast", kv_cache_dtype="int8",
                          kernel_build="background")
    assert config.spec_method is SpecMethod.NGRAM and config.policy is SchedulingPolicy.SPF
    assert config.attention_backend is AttentionBackendName.FAST and config.kv_cache_dtype is KvCacheDtype.INT8
    assert config.kernel_build is KernelBuild.BACKGROUND
    assert EngineConfig(spec_method="none").spec_method is None  # the CLI's spelling of off
    assert SchedulerConfig(policy="priority").policy is SchedulingPolicy.PRIORITY
    config.policy = "fcfs"  # through the held SchedulerConfig
    assert config.policy is SchedulingPolicy.FCFS
    values = json.loads(json.dumps(config.knob_values()))
    assert (values["spec_method"], values["policy"], values["attention_backend"]) == ("ngram", "fcfs", "fast")
    assert KNOB["spec_method"].check("mtp") is SpecMethod.MTP and KNOB["spec_method"].check("none") is None


def test_reconfigure_stores_the_member(tiny_llama):
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4))
    eng.reconfigure(spec_method="ngram", num_speculative_tokens=2, policy="spf")
    eng.step()  # commands are taken at the top of a step
    assert eng.config.spec_method is SpecMethod.NGRAM and eng.config.policy == "spf"
    eng.reconfigure(spec_method="none")
    eng.step()
    assert eng.config.spec_method is None


def test_the_apps_kinds_are_members_and_stored_results_keep_their_fingerprints():
    """Arrivals, bench prompts and a comparison's modes are enums too; a comparison stored under a spec read
    with plain strings has the same fingerprint (the key its results are kept under) as one read now."""
    from dataclasses import replace

    from app.load.generator import LoadConfig, LoadGenerator
    from app.load.kinds import ArrivalKind
    from app.talk.compare.kinds import ArrivalMode, RunMode
    from app.talk.compare.spec import ConfigSpec, parse_compare

    gen = LoadGenerator(LoadConfig(), corpus_ids=list(range(100, 400)), rng_seed=1)
    assert gen.make_arrival().kind is ArrivalKind.POISSON
    assert gen.make_arrival(ArrivalKind.BURST).kind == "burst"
    spec = parse_compare({"title": "t", "workload": {"arrival": "burst", "burst_requests": 2},
                          "configs": [{"label": "a", "mode": "static"}, {"label": "b"}]})
    assert spec.workload.arrival is ArrivalMode.BURST and spec.configs[0].mode is RunMode.STATIC
    plain = replace(spec, workload=replace(spec.workload, arrival="burst"),
                    configs=(ConfigSpec("a", {}, "static"), ConfigSpec("b", {}, "continuous")))
    assert plain.fingerprint() == spec.fingerprint()
