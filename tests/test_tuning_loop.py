"""Issue 27, point 3: the tuning loop closed. A tradeoff point's settings are `inferlab serve` flags
(every knob the sweep varies, validated), a point copies as the command that deploys it, an applied
point reuses the sweep's perplexities, the sweep lets live requests finish instead of aborting them,
and an attached server's tokens/s is the server's own."""
from __future__ import annotations

import shlex

import pytest

from app.cli import build_parser, main
from app.host.engine_work import adopt_perplexity
from app.knob_args import serve_command
from app.server.serve import engine_config
from app.source import channel
from app.tradeoff.live_wait import finish_live_requests
from app.tradeoff.point_quality import reusable_perplexity


def serve_config(*flags: str):
    return engine_config(build_parser().parse_args(["serve", *flags]))


def test_serve_takes_every_knob_the_sweep_varies():
    cfg = serve_config("--quant-bits", "4", "--quant-group-size", "64", "--kv-cache-dtype", "int8",
                       "--spec-method", "ngram", "--num-draft-tokens", "3", "--max-num-seqs", "8")
    assert (cfg.quant_bits, cfg.quant_group_size, cfg.kv_cache_dtype) == (4, 64, "int8")
    assert (cfg.spec_method, cfg.num_speculative_tokens, cfg.max_num_seqs) == ("ngram", 3, 8)
    plain = serve_config()
    assert (plain.quant_bits, plain.kv_cache_dtype, plain.spec_method, plain.num_speculative_tokens) == (
        16, "auto", None, 0)
    assert serve_config("--spec-method", "ngram").num_speculative_tokens == 4  # the documented default


@pytest.mark.parametrize("flags, says", [
    (["--num-draft-tokens", "4"], "--num-draft-tokens needs --spec-method"),
    (["--spec-method", "ngram", "--num-draft-tokens", "9"], "--num-draft-tokens must be 1-8"),
    (["--spec-method", "ngram", "--num-draft-tokens", "0"], "--num-draft-tokens must be 1-8"),
    (["--spec-method", "draft"], "--spec-method draft needs --draft-model"),
    (["--quant-group-size", "64"], "--quant-group-size needs --quant-bits 8 or 4"),
    (["--draft-model", "x"], "--draft-model needs --spec-method draft"),
])
def test_bad_knob_flags_are_one_error_line(capsys, flags, says):
    assert main(["serve", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("inferlab: error:") == 1 and says in err and "Traceback" not in err


def test_out_of_range_values_are_refused_by_argparse(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--quant-bits", "3"])
    assert "--quant-bits" in capsys.readouterr().err


@pytest.mark.parametrize("config", [
    {"max_num_seqs": 32, "quant_bits": 4, "quant_group_size": 64, "num_speculative_tokens": 4},
    {"max_num_seqs": 1, "quant_bits": 16, "num_speculative_tokens": 0},
    {"max_num_seqs": 8, "quant_bits": 8, "quant_group_size": 64, "num_speculative_tokens": 0,
     "kv_cache_dtype": "int8"},
])
def test_a_points_command_deploys_that_point(config):
    line = serve_command(config, "smollm2-135m")
    argv = shlex.split(line)
    assert argv[:2] == ["inferlab", "serve"]
    cfg = engine_config(build_parser().parse_args(argv[1:]))
    assert (cfg.model, cfg.max_num_seqs, cfg.quant_bits) == ("smollm2-135m", config["max_num_seqs"],
                                                             config["quant_bits"])
    assert cfg.num_speculative_tokens == config["num_speculative_tokens"]
    assert cfg.spec_method == ("ngram" if config["num_speculative_tokens"] else None)
    assert cfg.quant_group_size == config.get("quant_group_size", 32)
    assert cfg.kv_cache_dtype == config.get("kv_cache_dtype", "auto")


SWEEP = [{"bits": 16, "group_size": None, "perplexity": 10.0},
         {"bits": 8, "group_size": 64, "perplexity": 10.1},
         {"bits": 4, "group_size": 64, "perplexity": 11.0},
         {"bits": 4, "group_size": 64, "perplexity": 11.0}]


def test_an_applied_point_reuses_the_sweeps_perplexity():
    point = {"quant_bits": 4, "quant_group_size": 64, "max_num_seqs": 8, "num_speculative_tokens": 0}
    assert reusable_perplexity(SWEEP, point, live_bits=16) == {16: 10.0, 4: 11.0}
    # live weights already at 4 bits: not requantized, their group size may differ: only 16 carries over
    assert reusable_perplexity(SWEEP, point, live_bits=4) == {16: 10.0}
    # a different group size than the sweep measured: not the same weights
    assert reusable_perplexity(SWEEP, {**point, "quant_group_size": 32}, live_bits=16) == {16: 10.0}
    assert reusable_perplexity([{"bits": 16, "perplexity": None}], point, live_bits=16) == {}


class FakeEngine:
    """Finishes one live request per step (or none: `stuck`); records aborts."""

    def __init__(self, host, stuck: bool = False) -> None:
        self.host, self.stuck, self.steps, self.aborted = host, stuck, 0, []

    def step(self) -> None:
        self.steps += 1
        if not self.stuck and self.host.live:
            self.host.live.pop()

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)


class FakeHost:
    def __init__(self, live: set[str], stuck: bool = False) -> None:
        self.live, self.stopping, self.published, self.perplexity = set(live), False, [], {}
        self.engine = FakeEngine(self, stuck)

    @property
    def live_request_ids(self) -> frozenset[str]:
        return frozenset(self.live)

    def publish(self, item) -> None:
        self.published.append(item)


def test_the_sweep_lets_live_requests_finish_and_never_aborts():
    host, said = FakeHost({"a", "b", "c"}), []
    assert finish_live_requests(host, 30.0, said.append) == 0
    assert host.engine.steps == 3 and host.engine.aborted == [] and "waiting for 3 live requests" in said[0]
    stuck = FakeHost({"a", "b"}, stuck=True)
    assert finish_live_requests(stuck, 0.05, lambda text: None) == 2  # they pause; the caller says so
    assert stuck.engine.aborted == [] and stuck.live == {"a", "b"}


def test_adopted_perplexity_is_known_and_published():
    host = FakeHost(set())
    host.perplexity[8] = 9.9
    adopt_perplexity(host, {16: 10.0, 4: 11.0})
    assert host.perplexity == {16: 10.0, 8: 9.9, 4: 11.0}
    assert host.published == [channel.Perplexity({16: 10.0, 8: 9.9, 4: 11.0})]


class Recorder:
    def __init__(self, calls: list, name: str, **attrs) -> None:
        self._calls, self._name = calls, name
        self.__dict__.update(attrs)

    def __getattr__(self, verb):
        return lambda *args: self._calls.append((f"{self._name}.{verb}", *args))


def test_applying_a_point_hands_the_sweeps_perplexity_over_before_requantizing():
    from types import SimpleNamespace

    from app.gui.tradeoff_actions import apply_config
    from app.source.engine_info import Capabilities

    calls: list = []
    tradeoff = Recorder(calls, "tradeoff", sweep_points=lambda: SWEEP)
    state = SimpleNamespace(capabilities=Capabilities(quantization=True), config={"quant_bits": 16})
    controller = Recorder(calls, "controller", engine_ready=True, state=state, host=Recorder(calls, "host"),
                          window=Recorder(calls, "window"),
                          panels=SimpleNamespace(tradeoff=tradeoff, controls=Recorder(calls, "controls")))
    point = {"max_num_seqs": 8, "quant_bits": 4, "quant_group_size": 64, "num_speculative_tokens": 0}
    apply_config(controller, point)
    verbs = [c[0] for c in calls]
    assert verbs.index("host.adopt_perplexity") < verbs.index("controller._on_config_changed")
    assert ("host.adopt_perplexity", {16: 10.0, 4: 11.0}) in calls
    assert ("controller._on_config_changed", point) in calls


def test_run_sweep_in_the_app_never_aborts_the_load_generators_requests(qapp, tiny_llama):
    """Requests in flight when "Run sweep" is pressed finish with their own reason, not "abort" (the old
    sweep aborted the load generator's live requests, though its caption says the live panels are
    untouched)."""
    from app_helpers import close_window, open_window, wait_until

    from app.tradeoff.sweep import SweepSpec
    from app.tradeoff.sweep_point import Workload

    w = open_window(tiny_llama, preset="continuous-batching")
    try:
        latency = w.panels.latency
        w.host.burst(4)  # in the engine's hands when the sweep's command arrives (one queue, in order)
        w.controller.run_sweep(SweepSpec(batches=(1,), bits=(16,), drafts=(0,), warmup_s=0.05, measure_s=0.2,
                                         memory_budget_bytes=32 * 2**20,
                                         workload=Workload(prompt_tokens=(8, 16), output_tokens=(4, 8))))
        wait_until(qapp, lambda: not w.controller.sweeping, 120)
        w.flush_panels()
        reasons = [t.finish_reason for t in latency._finished]
        assert reasons and "abort" not in reasons, reasons
    finally:
        close_window(w)


def test_copy_as_command_puts_the_points_serve_line_on_the_clipboard(qapp):
    from types import SimpleNamespace

    from PySide6.QtGui import QGuiApplication

    from app.gui.tradeoff_actions import copy_command

    calls: list = []
    controller = Recorder(calls, "controller", window=Recorder(calls, "window"),
                          host=Recorder(calls, "host", info=SimpleNamespace(model="smollm2-135m")))
    line = copy_command(controller, {"max_num_seqs": 8, "quant_bits": 4, "quant_group_size": 64,
                                     "num_speculative_tokens": 4})
    assert line == ("inferlab serve --model smollm2-135m --max-num-seqs 8 --quant-bits 4 --quant-group-size 64 "
                    "--spec-method ngram --num-draft-tokens 4")
    assert QGuiApplication.clipboard().text() == line and ("window.show_message", "copied: " + line) in calls
