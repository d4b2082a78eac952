"""Recordings (app/record/): an engine's run written down through its Python API and read back item for
item, with the figures the panels get (step stats, outputs, snapshots, knob changes) the same."""
from __future__ import annotations

import dataclasses
import gzip

import pytest

from app.record.codec import BadItem, Decoder, encode
from app.record.engine_recorder import EngineRecorder
from app.record.reader import open_recording
from app.source import channel
from app.source.engine_info import EngineInfo
from engine.config import EngineConfig
from engine.drive import drive
from engine.events import BlockMapSnapshot, EngineStepEvent, MemorySnapshot, StepKind, TokenSource
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, num_threads=1, max_num_seqs=4))


def _run(engine, n: int = 6, max_tokens: int = 12) -> list[EngineStepEvent]:
    seen = []
    engine.add_listener(seen.append)
    try:
        for i in range(n):
            engine.add_request(list(range(5 + i, 25 + i)), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                         ignore_eos=True))
        drive(engine)
    finally:
        engine.remove_listener(seen.append)
    return seen


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_an_engine_run_reads_back_item_for_item(engine, tmp_path, compression):
    path = tmp_path / f"run-{compression}.inferlab-run"
    with EngineRecorder.for_engine(engine, path, what="test run", compression=compression) as rec:
        with rec.follow(engine, "four at a time"):
            live = _run(engine)
            engine.reconfigure(max_num_seqs=2)
            live += _run(engine, n=3)
    with open_recording(path) as replay:
        assert replay.header["format"] == "inferlab-run" and replay.header["model"] == engine.config.model
        assert replay.header["knobs"]["max_num_seqs"] == 4
        items = [item for _t, item in replay.items()]
        assert replay.cut_short is None and replay.ended["dropped"] == 0 and replay.skipped == 0
    steps = [i for i in items if isinstance(i, EngineStepEvent)]
    assert [s.stats for s in steps] == [e.stats for e in live]  # every step's figures, enums and tuples as they were
    assert [s.outputs for s in steps] == [e.outputs for e in live]  # running token ids and text rebuilt from deltas
    assert [s.finished for s in steps] == [e.finished for e in live]
    assert isinstance(steps[0].stats.scheduled[0][2], StepKind)
    assert all(isinstance(src, TokenSource) for s in steps for o in s.outputs for src in o.sources)
    kinds = {type(i) for i in items}
    assert {EngineInfo, channel.Reset, channel.Message, MemorySnapshot, BlockMapSnapshot} <= kinds
    info = next(i for i in items if isinstance(i, EngineInfo))
    assert info.capabilities.step_events and info.num_kv_blocks == 64
    changes = [i for i in items if isinstance(i, channel.KnobsChanged)]
    assert [(dict(c.values), c.text) for c in changes] == [({}, "run: four at a time"),  # the run's mark
                                                          ({"max_num_seqs": 2}, "max_num_seqs 4 → 2")]
    engine.reconfigure(max_num_seqs=4)
    _run(engine, n=1)  # applied at the top of a step


def test_every_channel_item_kind_round_trips():
    """Each item a source publishes comes back equal (the attached server's too)."""
    from app.load.kinds import ArrivalKind
    from app.remote.facts import BucketPercentiles, ServerFacts
    from engine.events import RequestOutput, RequestTimeline

    facts = ServerFacts(t=1.5, kind="vllm", running=3.0, kv_blocks=(100, 16),
                        latency={"ttft": BucketPercentiles({50: 0.1, 99: 0.4}, frozenset({99}), 12, 30.0), "e2e": None})
    out = RequestOutput("r1", (5,), "hi", (5,), "hi", False, sources=(TokenSource.DECODED,))
    items = [channel.LoadStream("r1", ArrivalKind.BURST, "tail", "pirate"), channel.Message("note"),
             channel.Busy("q", 0.5),
             channel.Perplexity({"bf16": 9.5, "int4": 10.25}), channel.LoraAdapters(({"name": "a", "rank": 8},)),
             channel.SideBySide({"r1": None, "r2": "shout"}, "p"), channel.ServerSample(facts),
             channel.ServerStatus("slow", "slow"), channel.ClientSent("r1", 2.0),
             channel.ClientOutput(out, 2.5, 1), channel.ClientFinished(RequestTimeline("r1", 2.0, 7, finished=3.0),
                                                                       (0.1, 0.2)),
             channel.QuantError("int4", {"layers.0.q_proj": 0.01}), channel.Quantized("int4", 120),
             channel.KnobsChanged({"max_num_seqs": 8}, "max batch 4 → 8"), channel.ComputeChanged("a", "b")]
    import json

    for item in items:
        kind = type(item).__name__
        back = Decoder().item(kind, json.loads(json.dumps(encode(item))))
        if isinstance(item, channel.ClientOutput):  # a delta: the running totals are rebuilt from it
            assert back.output.token_ids == (5,) and back.output.text == "hi"
            continue
        assert back == item, kind
    assert dataclasses.is_dataclass(items[0])
    back = Decoder().item("LoadStream", json.loads(json.dumps(encode(items[0]))))
    assert type(back.kind) is ArrivalKind  # the member, rebuilt by its type hint (a plain string would pass ==)
    with pytest.raises(BadItem, match="is not a ArrivalKind"):  # a kind the enum lacks: the line refused
        Decoder().item("LoadStream", {**encode(items[0]), "kind": "chat"})


def test_a_recording_names_its_machine_and_date(engine, tmp_path):
    from app.record.header import recorded_on

    path = tmp_path / "r.inferlab-run"
    EngineRecorder.for_engine(engine, path, what="x", compression="gzip").close()
    with gzip.open(path) as f:
        assert b'"format":"inferlab-run"' in f.readline()
    with open_recording(path) as rec:
        text = recorded_on(rec.header)
    assert text.startswith("recorded on ") and "UTC" in text and "unknown" not in text


def test_prepare_records_each_chapters_runs_beside_its_comparison(tiny_llama, tmp_path, monkeypatch):
    """The chapter's measured runs, stored beside its comparison (and copied to --record DIR), end with the
    comparison itself: a replay elsewhere shows the figures measured with them."""
    import argparse

    from app.talk.compare import prepare
    from app.talk.compare.profile import use_profile
    from app.talk.compare.store import store_root

    monkeypatch.setenv("INFERLAB_DATA_DIR", str(tmp_path / "data"))
    use_profile(None)
    args = argparse.Namespace(preset=["continuous-batching"], model=str(tiny_llama), dtype="float32", device="cpu",
                              threads=1, json=None, background_compile=False, profile=None, record_runs=True,
                              record=str(tmp_path / "copies"), record_limit=2**26)
    assert prepare.run_prepare(args) == 0
    stored = list(store_root().rglob("continuous-batching.json"))
    recorded = [p.with_suffix(".inferlab-run") for p in stored]
    assert len(stored) == 1 and recorded[0].is_file()
    assert (tmp_path / "copies" / "continuous-batching.inferlab-run").read_bytes() == recorded[0].read_bytes()
    with open_recording(recorded[0]) as rec:
        assert rec.header["preset"] == "continuous-batching" and rec.cut_short is None
        items = [item for _t, item in rec.items()]
    labels = [i.text for i in items if isinstance(i, channel.Message)]
    assert labels and all(text.startswith("recorded run: static batches vs continuous batching") for text in labels)
    assert len(labels) == 2 * 3  # two configurations, three rounds each
    result = items[-1]
    assert isinstance(result, channel.ComparisonResult) and result.preset == "continuous-batching"
    import json

    assert result.result["comparison"] == json.loads(stored[0].read_text())["comparison"]
    finished = sum(len(i.finished) for i in items if isinstance(i, EngineStepEvent))
    assert finished == 6 * 8  # every measured request of every run
