"""Admission control: beyond max_queue_len or max_predicted_wait_s, add_request refuses at once."""
from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.admission import AdmissionController, QueueState, RequestRejected
from engine.events import StepStats

PARAMS = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def make(folder, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_kv_blocks=128, block_size=4, **kw))


def stats(prefill: int, decode: int, wall: float) -> StepStats:
    return StepStats(step=0, t_start=0.0, wall_time_s=wall, num_prefill_tokens=prefill, num_decode_tokens=decode,
                     num_running=0, num_waiting=0, num_preempted=0, kv_blocks_used=0, kv_blocks_total=1)


def test_config_validates_limits():
    with pytest.raises(ValueError):
        EngineConfig(max_queue_len=-1)
    with pytest.raises(ValueError):
        EngineConfig(max_predicted_wait_s=float("nan"))
    assert EngineConfig().max_queue_len is None and EngineConfig().max_predicted_wait_s is None


def test_queue_length_limit(tiny_llama):
    eng = make(tiny_llama, max_queue_len=2, max_num_seqs=1)
    events = []
    eng.add_listener(events.append)
    eng.add_request([5, 6, 7], PARAMS)
    eng.add_request([5, 6, 8], PARAMS)
    with pytest.raises(RequestRejected) as info:
        eng.add_request([5, 6, 9], PARAMS)
    assert not isinstance(info.value, ValueError)  # a busy engine, not a bad request
    assert info.value.reason == "queue_full" and info.value.retry_after_s >= 1
    assert eng.stats().num_rejected == 1
    eng.step()  # one admitted (one seat), one still waiting
    assert events[-1].stats.num_rejected == 1 and events[-1].stats.num_waiting == 1
    eng.add_request([5, 6, 10], PARAMS)  # room again: the queue holds one
    with pytest.raises(RequestRejected):
        eng.add_request([5, 6, 11], PARAMS)
    while eng.has_unfinished():
        eng.step()
    assert events[-1].stats.num_rejected == 0 and eng.stats().num_rejected == 2
    assert sum(e.stats.num_rejected for e in events) == 2
    assert eng.stats().num_finished == 3


def test_queue_limit_can_change_at_run_time(tiny_llama):
    eng = make(tiny_llama, max_num_seqs=1)
    eng.reconfigure(max_queue_len=0)
    eng.step()
    with pytest.raises(RequestRejected):
        eng.add_request([5, 6, 7], PARAMS)
    eng.reconfigure(max_queue_len=None)
    eng.step()
    eng.add_request([5, 6, 7], PARAMS)


def test_predicted_wait_limit(tiny_llama):
    eng = make(tiny_llama, max_predicted_wait_s=0.5)
    eng.add_request(list(range(10, 70)), PARAMS)  # nothing measured yet: no prediction, admitted
    eng.admission.prefill_tokens_per_s, eng.admission.step_s = 100.0, 0.01  # as if measured
    with pytest.raises(RequestRejected) as info:  # 60 queued tokens / 100 tok/s + 1 * 0.01 s = 0.61 s > 0.5 s
        eng.add_request([5, 6, 7], PARAMS)
    assert info.value.reason == "predicted_wait" and info.value.retry_after_s == 1.0
    assert "predicted wait 0.61 s" in str(info.value)


def test_controller_measures_and_predicts():
    cfg = EngineConfig()
    ctl = AdmissionController(cfg)
    assert ctl.predicted_wait_s(3, 300) is None
    ctl.observe(stats(0, 4, 0.05), [])  # decode only: step time, no prefill rate
    assert ctl.prefill_tokens_per_s is None and ctl.step_s == pytest.approx(0.05)
    ctl.observe(stats(96, 4, 0.1), [])  # 100 tokens in 0.1 s
    assert ctl.prefill_tokens_per_s == pytest.approx(1000.0)
    assert ctl.step_s == pytest.approx(0.8 * 0.05 + 0.2 * 0.1)
    assert ctl.predicted_wait_s(2, 500) == pytest.approx(0.5 + 2 * ctl.step_s)
    ctl.check(QueueState(100, 10**6))  # limits off: never refuses
    ctl.set_limits(None, 1.0)  # (its own copy of the limits: the config it was built from stays as it is)
    with pytest.raises(RequestRejected):
        ctl.check(QueueState(1, 2000))
    ctl.set_limits(1, 1.0)
    with pytest.raises(RequestRejected, match="queue is full"):
        ctl.check(QueueState(1, 0))


def test_the_engine_measures_what_the_prediction_uses(tiny_llama):
    """No rates set by hand: a prefill step measures them (LLMEngine publishes each step to admission
    control), the prediction follows, a tight limit refuses, and /metrics shows the predicted wait."""
    import math

    from engine.serving.prometheus import ServingMetrics

    eng = make(tiny_llama, max_num_seqs=1)
    metrics = ServingMetrics(eng, "tiny").attach()
    assert eng.admission.prefill_tokens_per_s is None and eng.admission.step_s is None
    assert "inferlab:predicted_queue_wait_seconds{model_name=\"tiny\"} NaN" in metrics.render()
    for start in (10, 80, 150):
        eng.add_request(list(range(start, start + 60)), PARAMS)
    eng.step()  # one 60-token prefill (one seat), two waiting
    assert eng.admission.prefill_tokens_per_s > 0 and eng.admission.step_s > 0
    line = next(x for x in metrics.render().splitlines() if x.startswith("inferlab:predicted_queue_wait_seconds"))
    assert math.isfinite(float(line.split()[-1])) and float(line.split()[-1]) > 0
    eng.reconfigure(max_predicted_wait_s=1e-9)
    eng.step()
    with pytest.raises(RequestRejected) as info:
        eng.add_request([5, 6, 7], PARAMS)
    assert info.value.reason == "predicted_wait"
