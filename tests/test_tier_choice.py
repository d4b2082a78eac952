"""The kernel tier of each family chosen by measurement (engine/kernels/tier_choice.py): made once at the
first build, stored beside the builds and reused, measured again when the builds change, and a stored file
that lies is ignored and measured anew; INFERLAB_CPU_TIER still forces. The timings themselves on this
CPU's real builds."""
from __future__ import annotations

import json
import os

import pytest

import engine.kernels as kernels
from engine.kernels import build, detect, tiers
from engine.kernels import tier_choice as tc
from engine.kernels.cpu_times import CpuTimes

TIERS = ("avx2", "avx512")


def _seconds(fast: str = "avx512") -> dict:
    """Timings where `fast` wins every family (its bf16 in the rows walk)."""
    slow = "avx2" if fast == "avx512" else "avx512"
    out = {f: {fast: 1.0, slow: 1.4} for f in tc.FAMILIES if f != "bf16"}
    out["bf16"] = {f"{fast}/rows": 1.0, f"{fast}/tiles": 1.9, f"{slow}/rows": 1.3, f"{slow}/tiles": 1.6}
    return out


class FakeModule:
    def __init__(self, tier: str) -> None:
        self.tier, self.body = tier, "tiles"

    def set_bf16_body(self, body: str) -> None:
        self.body = body


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """Two tiers to choose from, fake builds and a fake measurement (counted), in a fresh extension cache."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.delenv("INFERLAB_CPU_TIER", raising=False)
    monkeypatch.setattr(detect, "supported_tiers", lambda *a, **k: ("portable", *TIERS))
    modules = {t: FakeModule(t) for t in TIERS}
    monkeypatch.setattr(kernels, "_build", lambda name, tier, progress: modules.get(tier))
    runs = []

    def measure(tier_modules, rounds=tc.ROUNDS):
        runs.append(sorted(tier_modules))
        return _seconds()

    monkeypatch.setattr(tc, "measure", measure)
    quiet = iter(CpuTimes(t, 0.0, 0.0, 0.0) for t in range(1000))  # nobody else busy while timing
    monkeypatch.setattr(tc, "read_cpu_times", lambda: next(quiet))
    tc.forget()
    yield runs, modules
    tc.forget()


def _path() -> str:
    builds = [build.build_name(t) for t in TIERS]
    return str(tiers.choice_path(builds))


def test_the_choice_is_measured_once_stored_and_reused(machine):
    """Fails on the old code: the tier was the best the CPU's features allow, never timed (no choose_tiers)."""
    runs, modules = machine
    choice = kernels.choose_tiers()
    assert runs == [list(TIERS)]  # portable is not timed where a SIMD tier runs
    assert choice.picks["bf16"] == "avx512/rows" and choice.tiers["int4"] == "avx512"
    assert modules["avx512"].body == "rows" and modules["avx2"].body == "tiles"
    assert os.path.isfile(_path())
    tc.forget()  # as a new process
    assert kernels.choose_tiers().picks == choice.picks and len(runs) == 1  # read, not measured again
    assert kernels.cpu_tier("attention") == "avx512" and kernels.cpu_tier() == "avx512"
    assert "timed fastest for bf16 within 5% (avx2/rows 1.30x, avx2/tiles 1.60x, avx512/tiles 1.90x its time)" \
        in kernels.describe_choice("bf16")


def test_new_builds_are_measured_again(machine, monkeypatch):
    runs, _ = machine
    kernels.choose_tiers()
    monkeypatch.setattr(build, "_source_digest", lambda: "another-source")  # a new version of the kernels
    tc.forget()
    assert kernels.measured_choice() is None  # the stored choice belongs to the old builds
    kernels.choose_tiers()
    assert len(runs) == 2


@pytest.mark.parametrize("lie", [
    "not json", "[]", "{}",
    {"picks": {"bf16": "avx2/rows"}},  # the slower candidate named fastest
    {"picks": {"int8": "neon"}},  # a tier this CPU does not run (a SIGILL, were it believed)
    {"picks": {"attention": "avx512/rows"}},  # a body the family has not
    {"seconds": {"int4": {"avx512": -1.0, "avx2": 1.4}}},
    {"seconds": {"int4": {"avx512": float("nan"), "avx2": 1.4}}},
    {"seconds": {"int4": {"avx512": True, "avx2": 1.4}}},
    {"builds": ["someone-else"]},
    {"version": 99},
    "huge",
])
def test_a_stored_choice_that_lies_is_ignored_and_measured_anew(machine, lie):
    runs, _ = machine
    good = kernels.choose_tiers()
    path = _path()
    if isinstance(lie, dict):
        data = good.as_json()
        for key, value in lie.items():
            data[key] = {**data[key], **value} if isinstance(value, dict) else value
        text = json.dumps(data)
    elif lie == "huge":
        text = json.dumps({**good.as_json(), "pad": "x" * (tc.MAX_FILE_BYTES + 1)})
    else:
        text = lie
    with open(path, "w") as f:
        f.write(text)
    tc.forget()
    assert kernels.measured_choice() is None
    assert kernels.choose_tiers().picks == good.picks and len(runs) == 2
    tc.forget()
    assert kernels.measured_choice() is not None  # the measurement rewrote a true file


def test_a_fifo_in_the_choices_place_is_no_choice(machine):
    kernels.choose_tiers()
    path = _path()
    os.unlink(path)
    os.mkfifo(path)
    tc.forget()
    assert kernels.measured_choice() is None  # not a regular file: not opened (a FIFO would block)


def test_the_environment_still_forces_a_tier(machine, monkeypatch):
    runs, _ = machine
    kernels.choose_tiers()
    monkeypatch.setenv("INFERLAB_CPU_TIER", "avx2")
    assert kernels.cpu_tier("bf16") == "avx2" and "forced by INFERLAB_CPU_TIER" in kernels.describe_choice()
    assert kernels.choose_tiers() is None and len(runs) == 1


@pytest.mark.skipif(len(kernels.timed_tiers()) < 2, reason="one SIMD tier on this CPU: nothing to time")
def test_the_real_builds_are_timed_per_family_and_body():
    modules = {t: kernels.kernel_module(tier=t) for t in kernels.timed_tiers()}
    if any(m is None for m in modules.values()):
        pytest.skip("no C++ toolchain to build the kernels")
    seconds = tc.measure(modules, rounds=1)
    assert set(seconds) == set(tc.FAMILIES)
    for family, times in seconds.items():
        assert set(times) == set(tc.candidates(family, modules)) and all(t > 0 for t in times.values())
    choice = tc.choose(seconds, ["a", "b"])
    assert tc.parse_choice(json.loads(json.dumps(choice.as_json())), ["a", "b"], tuple(modules)) == choice
    for tier, module in modules.items():  # the walks give the same numbers: the body left set is harmless
        tc.apply_bodies(kernels.measured_choice(), tier, module)


def test_a_difference_within_the_margin_keeps_the_higher_tier():
    seconds = {f: {"avx2": 0.98, "avx512": 1.0} for f in tc.FAMILIES if f != "bf16"}
    seconds["bf16"] = {"avx2/tiles": 1.2, "avx2/rows": 0.6, "avx512/tiles": 1.0, "avx512/rows": 0.97}
    choice = tc.choose(seconds, ["a", "b"])
    assert choice.picks == {"bf16": "avx2/rows", "int4": "avx512", "int8": "avx512", "attention": "avx512"}
    seconds["bf16"] = {"avx2/tiles": 0.95, "avx2/rows": 1.3, "avx512/tiles": 1.7, "avx512/rows": 0.97}
    assert tc.choose(seconds, ["a", "b"]).picks["bf16"] == "avx512/rows"  # within 5 %: the higher tier


def test_a_choice_timed_on_a_busy_machine_is_used_but_not_stored(machine, monkeypatch):
    runs, _ = machine
    clock = iter([CpuTimes(0.0, 0.0, 0.0, 0.0), CpuTimes(1.0, 1.5, 0.4, 0.0)])  # others: 1.1 cores
    monkeypatch.setattr(tc, "read_cpu_times", lambda: next(clock))
    choice = kernels.choose_tiers()
    assert choice.busy_cores == pytest.approx(1.1) and kernels.cpu_tier() == "avx512"  # used now
    assert not os.path.exists(_path())  # timed again at the next start
