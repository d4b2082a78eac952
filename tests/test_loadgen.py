"""LoadGenerator: Poisson arrivals, bursts, length ranges, shared prefixes, context limits (no torch)."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from app.load.generator import Arrival, LoadConfig, LoadGenerator, corpus_text

CORPUS = list(range(1000, 3000))


def gen(seed: int = 0, max_model_len: int | None = None, **cfg) -> LoadGenerator:
    return LoadGenerator(LoadConfig(**cfg), corpus_ids=CORPUS, rng_seed=seed, max_model_len=max_model_len)


def test_poisson_rate_and_exponential_gaps():
    g = gen(arrival_rate=5.0)
    g.start(0.0)
    assert len(g.due(2000.0)) == 1000  # one call returns at most MAX_CATCH_UP after a long stall
    times = []
    g = gen(arrival_rate=5.0)
    g.start(0.0)
    t = 0.0
    while t < 2000.0:
        t += 1.0
        times += [a.due for a in g.due(t)]
    rate = len(times) / 2000.0
    assert abs(rate - 5.0) < 0.25
    gaps = [b - a for a, b in zip(times, times[1:])]
    mean = sum(gaps) / len(gaps)
    var = sum((x - mean) ** 2 for x in gaps) / len(gaps)
    assert abs(mean - 0.2) < 0.01 and abs(math.sqrt(var) - 0.2) < 0.02  # exponential: sd == mean
    assert times == sorted(times)


def test_nothing_due_before_start_or_after_stop_and_rate_zero():
    g = gen(arrival_rate=10.0)
    assert g.due(100.0) == [] and g.next_due() == math.inf
    g.start(100.0)
    assert g.running and g.next_due() == 100.0  # the first request arrives when the load starts
    assert len(g.due(100.0)) == 1 and g.next_due() > 100.0  # the next after an exponential gap
    g.stop()
    assert g.due(1e9) == [] and not g.running
    g = gen(arrival_rate=0.0)
    g.start(0.0)
    assert g.due(1e6) == [] and g.next_due() == math.inf


def test_rate_change_redraws_from_now():
    g = gen(arrival_rate=0.001)
    g.start(0.0)
    g.set_rate(1000.0, 50.0)
    assert 50.0 < g.next_due() < 50.1
    assert len(g.due(51.0)) > 500


def test_burst_is_due_now_even_without_poisson():
    g = gen(burst_prompt_tokens=(300, 400), burst_output_tokens=(5, 9), prompt_tokens=(10, 20))
    g.burst(4, now=7.0)
    assert g.next_due() == 7.0
    out = g.due(7.0)
    assert [a.kind for a in out] == ["burst"] * 4
    assert all(300 <= len(a.prompt_token_ids) <= 400 and 5 <= a.sampling["max_tokens"] <= 9 for a in out)
    assert g.due(1e9) == []


def test_lengths_text_and_sampling_kwargs():
    g = gen(prompt_tokens=(20, 30), output_tokens=(3, 4), temperature=0.5, ignore_eos=True)
    g.start(0.0)
    out = g.due(1000.0)
    assert out
    for a in out:
        assert isinstance(a, Arrival) and a.kind == "poisson"
        assert 20 <= len(a.prompt_token_ids) <= 30
        assert set(a.prompt_token_ids) <= set(CORPUS)
        # a window of the corpus: consecutive ids (wrapping at the end)
        diffs = {(b - a_) % len(CORPUS) for a_, b in zip(a.prompt_token_ids, a.prompt_token_ids[1:])}
        assert diffs <= {1, (1 - len(CORPUS)) % len(CORPUS)}
        s = a.sampling
        assert 3 <= s["max_tokens"] <= 4 and s["temperature"] == 0.5 and s["ignore_eos"] is True
        assert isinstance(s["seed"], int)


def test_shared_prefix_is_identical_across_requests():
    g = gen(shared_prefix_tokens=48, prompt_tokens=(5, 10))
    a, b = g.make_arrival(), g.make_arrival()
    assert a.prompt_token_ids[:48] == b.prompt_token_ids[:48] == CORPUS[:48]
    assert 53 <= len(a.prompt_token_ids) <= 58


def test_context_limit_cuts_prompt_and_output():
    g = gen(max_model_len=64, prompt_tokens=(500, 600), output_tokens=(100, 200), shared_prefix_tokens=40)
    for _ in range(20):
        a = g.make_arrival()
        assert len(a.prompt_token_ids) + a.sampling["max_tokens"] <= 64
        assert len(a.prompt_token_ids) >= 1 and a.sampling["max_tokens"] >= 1


def test_same_seed_same_workload():
    def run(seed):
        g = gen(seed, arrival_rate=3.0)
        g.start(0.0)
        return [(a.due, a.prompt_token_ids, a.sampling) for a in g.due(30.0)]
    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.mark.parametrize("bad", [dict(arrival_rate=-1.0), dict(arrival_rate=float("nan")),
                                 dict(prompt_tokens=(0, 5)), dict(output_tokens=(9, 3)),
                                 dict(shared_prefix_tokens=-2), dict(temperature=-0.1)])
def test_bad_config_raises(bad):
    with pytest.raises(ValueError):
        LoadConfig(**bad)


def test_needs_a_corpus_and_uses_a_tokenizer():
    with pytest.raises(ValueError):
        LoadGenerator(LoadConfig())

    class Tok:
        def encode(self, text, add_special_tokens=True):
            assert add_special_tokens is False
            return [len(w) for w in text.split()]

    g = LoadGenerator(LoadConfig(prompt_tokens=(4, 4)), Tok())
    assert len(g.make_arrival().prompt_token_ids) == 4
    assert corpus_text().strip()


def test_imports_no_torch():
    code = "import sys, app.load.generator; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _serve_users(g: LoadGenerator, seconds: float, service_s: float, dt: float = 0.01) -> tuple[int, int]:
    """A fake server that answers every question after `service_s`; returns (questions, max in flight)."""
    g.start(0.0)
    in_flight: dict[str, float] = {}  # request id -> when its answer is due
    asked, peak, t = 0, 0, 0.0
    while t < seconds:
        for rid, done in list(in_flight.items()):
            if done <= t:
                del in_flight[rid]
                g.on_finished(rid, t)
        for a in g.due(t):
            assert a.kind == "user"
            rid = f"r{asked}"
            asked += 1
            in_flight[rid] = t + service_s
            g.on_submitted(rid, a, t)
        peak = max(peak, len(in_flight))
        t += dt
    return asked, peak


def test_closed_loop_users_wait_for_answers_then_think():
    # 4 users, 0.5 s think, 0.5 s answers: each asks about once a second, never more than 4 in flight
    g = gen(arrival_rate=0.0, num_users=4, think_time_s=0.5)
    asked, peak = _serve_users(g, 100.0, 0.5)
    assert peak <= 4 and abs(asked / 100.0 - 4.0) < 0.6
    # a slower server slows the users down: that is the closed loop
    slow, _ = _serve_users(gen(arrival_rate=0.0, num_users=4, think_time_s=0.5), 100.0, 3.5)
    assert abs(slow / 100.0 - 1.0) < 0.2


def test_closed_loop_refusal_and_resizing():
    g = gen(arrival_rate=0.0, num_users=2, think_time_s=0.0)
    g.start(0.0)
    first = g.due(0.0)
    assert [a.kind for a in first] == ["user", "user"] and g.due(1.0) == []  # both wait for answers
    g.on_submitted(None, first[0], 1.0)  # refused: that user asks again after thinking (0 s)
    g.on_submitted("b", first[1], 1.0)
    assert len(g.due(1.0)) == 1
    g.set_config(LoadConfig(arrival_rate=0.0, num_users=5, think_time_s=0.0), 2.0)
    assert len(g.due(2.0)) == 3  # three new users
    g.set_config(LoadConfig(arrival_rate=0.0, num_users=0, think_time_s=0.0), 3.0)
    g.on_finished("b", 3.0)  # the busy ones retire when answered
    assert g.due(10.0) == []
    with pytest.raises(ValueError):
        LoadConfig(num_users=-1)


def test_lora_mix_and_instruction_prompts():
    instructions = [[900, 901, 902], [910, 911]]
    gen = LoadGenerator(LoadConfig(lora_mix=("base", "a", "b"), instructions=True), corpus_ids=list(range(50)),
                        rng_seed=4, instructions=instructions)
    arrivals = [gen.make_arrival() for _ in range(60)]
    assert {a.lora_name for a in arrivals} == {None, "a", "b"}  # "base" runs on the base model
    assert all(a.prompt_token_ids in instructions for a in arrivals)
    assert gen.make_arrival("burst").prompt_token_ids[0] < 50  # bursts stay long windows of text
    plain = LoadGenerator(LoadConfig(), corpus_ids=list(range(50)), rng_seed=4, instructions=instructions)
    assert all(plain.make_arrival().lora_name is None for _ in range(5))
    with pytest.raises(ValueError, match="lora_mix"):
        LoadConfig(lora_mix=("",))
