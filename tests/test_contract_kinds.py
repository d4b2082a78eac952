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
