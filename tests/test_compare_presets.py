"""[compare] in presets: every shipped preset declares one, and a broken one is reported as file:line."""
from __future__ import annotations

import pytest

from app.talk.presets import PresetError, available, load_preset

HEAD = '[preset]\ntitle = "T"\ncaption = "C"\n\n'


def test_every_shipped_preset_declares_a_comparison():
    for name in available():
        spec = load_preset(name).compare
        assert spec is not None and not spec.not_built, name
        assert spec.configs and spec.metrics and set(spec.chart) <= set(spec.metrics), name


def _error(tmp_path, body: str) -> PresetError:
    path = tmp_path / "p.toml"
    path.write_text(HEAD + body)
    with pytest.raises(PresetError) as info:
        load_preset(str(path))
    return info.value


@pytest.mark.parametrize(("body", "line", "where", "says"), [
    ('[compare]\ntitle = "x"\nknob = "max_num_seqs"\nvalues = [1, 2]\nmetrics = ["speed"]\n', 9, "[compare] metrics",
     "metric names"),
    ('[compare]\ntitle = "x"\nknob = "colour"\nvalues = [1, 2]\n', 7, "[compare] knob", "unknown knob"),
    ('[compare]\ntitle = "x"\nknob = "max_num_seqs"\nvalues = ["many"]\n', 8, "[compare] values",
     "max_num_seqs: expected an integer >= 1"),
    ('[compare]\ntitle = "x"\nknob = "max_num_seqs"\nvalues = [1]\n\n[compare.workload]\nrequests = 8\n'
     'arrival = "sometimes"\n', 12, "[compare.workload] arrival", "all, poisson, burst"),
    ('[compare]\ntitle = "x"\nknob = "max_num_seqs"\nvalues = [1]\n\n[compare.workload]\nprompt_tokens = [9, 2]\n',
     11, "[compare.workload] prompt_tokens", "lo <= hi"),
    ('[compare]\ntitle = "x"\n\n[[compare.configs]]\nlabel = "a"\n\n[[compare.configs]]\nlabel = "b"\n'
     'mode = "sideways"\n', 13, "[compare.configs #2] mode", "continuous, static"),
    ('[compare]\nknob = "max_num_seqs"\nvalues = [1]\n', 5, "[compare] title", "missing"),
    ('[compare]\ntitle = "x"\n', 5, "[compare] knob", "missing"),
    ('[compare]\ntitle = "x"\nwhatever = 1\n', 7, "[compare] whatever", "unknown key"),
    ('[compare]\ntitle = "x"\n\n[[compare.configs]]\nlabel = "a"\nadapters = 99\n', 10, "[compare.configs #1] adapters",
     "an integer in [0, 64]"),
])
def test_schema_errors_name_file_line_and_key(tmp_path, body, line, where, says):
    err = _error(tmp_path, body)
    assert err.line == line, str(err)
    assert err.where == where and says in err.message, str(err)
    assert str(err).startswith(f"{tmp_path / 'p.toml'}:{line}: {where}: ")


def test_named_configs_and_values_parse(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text(HEAD + '[compare]\ntitle = "x"\nmetrics = ["tokens_per_s", "p99_ttft_ms"]\n\n'
                    '[compare.workload]\narrival = "poisson"\nrate = 2\nseed = 5\n\n'
                    '[[compare.configs]]\nlabel = "unchunked"\nenable_chunked_prefill = false\n\n'
                    '[[compare.configs]]\nlabel = "computed"\nmode = "contiguous"\n')
    spec = load_preset(str(path)).compare
    assert [c.label for c in spec.configs] == ["unchunked", "computed"]
    assert spec.configs[0].knobs == {"enable_chunked_prefill": False} and spec.configs[1].mode == "contiguous"
    assert spec.workload.rate == 2.0 and spec.workload.seed == 5 and spec.headline == "tokens_per_s"
    assert spec.chart == ("tokens_per_s",)
