"""The vLLM and SGLang flag tables (app/managed/vllm.py, sglang.py) against what the published
wheels declare (issue 48, point 10): every flag a table emits or documents, every value it passes where the
engine has a fixed list, and the lists themselves, read from the pinned wheels' source with ast
(tests/peer_wheels.py; nothing imported). Before, the tables were checked against the app's own constants
and a stand-in parser written from them, so a wrong row still passed. The wheels come from
`python tests/peer_wheels.py` (.ci/run runs it); where they are absent these tests skip, saying so."""
from __future__ import annotations

import re

import pytest
from peer_wheels import WHEELS, find_wheel, sglang_declared, vllm_declared, wheel_dir
from test_managed_flag_tables import EVERY_KNOB, MODEL, NO_DRAFT, PORT

from app.managed import sglang, vllm
from app.managed.table import FlagError, ServerPoint

POINTS = [ServerPoint(), ServerPoint(batch=3), ServerPoint(weight_format="fp8"), ServerPoint(weight_format="awq"),
          ServerPoint(draft=3),
          *(ServerPoint(kv_dtype=k) for k in ("fp8", "f16", "bf16", "auto")), *EVERY_KNOB]


def declared(name: str):
    wheel = find_wheel(name)
    if wheel is None:
        pytest.skip(f"the {name}=={WHEELS[name]} wheel is not in {wheel_dir()} (python tests/peer_wheels.py)")
    return (vllm_declared if name == "vllm" else sglang_declared)(wheel)


@pytest.fixture(scope="module")
def vllm_wheel():
    return declared("vllm")


@pytest.fixture(scope="module")
def sglang_wheel():
    return declared("sglang")


def emitted(engine) -> list[list[str]]:
    """Every argv the table builds over the knobs, with and without a draft model (server args aside); a
    point the table refuses (FlagError: SGLang has no f16 KV, NO_DRAFT no 4-bit checkpoint) is
    test_managed_flag_tables'."""
    out = []
    for model in (MODEL, NO_DRAFT):
        for point in POINTS:
            try:
                out.append(engine.argv(engine.executable, model, point, PORT))
            except FlagError:
                continue
    return out


def undeclared(argvs: list[list[str]], flags: set[str]) -> set[str]:
    return {t for argv in argvs for t in argv if t.startswith("--") and t not in flags}


def documented(rows) -> set[str]:
    return {f for row in rows for f in re.findall(r"--[a-z0-9][a-z0-9-]*", row.flag)}


def test_the_tables_name_the_wheels_pinned_here(vllm_wheel, sglang_wheel):
    assert vllm_wheel.version == WHEELS["vllm"] and f"vLLM {WHEELS['vllm']} " in vllm.VLLM_SOURCE
    assert sglang_wheel.version == WHEELS["sglang"] and f"SGLang {WHEELS['sglang']} " in sglang.SGLANG_SOURCE


def test_every_vllm_flag_the_table_emits_or_documents_is_declared(vllm_wheel):
    argvs = emitted(vllm.VllmEngine())
    assert undeclared(argvs, vllm_wheel.flags) == set()
    assert documented(vllm.VLLM_ROWS) - vllm_wheel.flags == set()
    assert {argv[1] for argv in argvs} == {"serve"} and "serve" in vllm_wheel.names["subcommands"]


def test_every_sglang_flag_the_table_emits_or_documents_is_declared(sglang_wheel):
    argvs = emitted(sglang.SglangEngine())
    assert undeclared(argvs, sglang_wheel.flags) == set()
    assert documented(sglang.SGLANG_ROWS) - sglang_wheel.flags == set()
    assert {tuple(argv[1:3]) for argv in argvs} == {("-m", "sglang.launch_server")}
    assert "sglang.launch_server" in sglang_wheel.names["modules"]


def test_the_lists_the_tables_check_values_against_are_the_wheels(vllm_wheel, sglang_wheel):
    assert vllm.VLLM_KV_CACHE_DTYPES == vllm_wheel.choices["--kv-cache-dtype"]
    assert vllm.VLLM_QUANTIZATION_METHODS == vllm_wheel.choices["--quantization"]
    assert sglang.SGLANG_KV_CACHE_DTYPES == sglang_wheel.choices["--kv-cache-dtype"]
    assert sglang.SGLANG_QUANTIZATION_METHODS == sglang_wheel.choices["--quantization"]


def test_the_values_the_tables_pass_are_ones_the_engines_take(vllm_wheel, sglang_wheel):
    for engine, wheel in ((vllm.VllmEngine(), vllm_wheel), (sglang.SglangEngine(), sglang_wheel)):
        for argv in emitted(engine):
            for flag, value in zip(argv, argv[1:]):
                if flag in wheel.choices:
                    assert value in wheel.choices[flag], (engine.name, flag, value)
    methods = {re.search(r'"method":"(\w+)"', a).group(1) for argv in emitted(vllm.VllmEngine()) for a in argv
               if a.startswith('{"method"')}
    assert methods == {"draft_model", "ngram"} and methods <= set(vllm_wheel.names["speculative methods"])
    algorithms = {argv[argv.index("--speculative-algorithm") + 1] for argv in emitted(sglang.SglangEngine())
                  if "--speculative-algorithm" in argv}
    assert algorithms == {"STANDALONE", "NGRAM"} and algorithms <= set(sglang_wheel.names["speculative algorithms"])


def test_a_wrong_row_no_longer_passes(vllm_wheel, sglang_wheel):
    """The checks are not vacuous: a flag one letter off, or one the other engine spells, is caught."""
    assert undeclared([["vllm", "serve", "m", "--max-num-seq", "8", "--max-running-requests", "8"]],
                      vllm_wheel.flags) == {"--max-num-seq", "--max-running-requests"}
    assert undeclared([["python", "--max-num-seqs", "8", "--disable-radix-caches"]],
                      sglang_wheel.flags) == {"--max-num-seqs", "--disable-radix-caches"}
    assert "fp8" not in sglang_wheel.choices["--kv-cache-dtype"]  # (SGLang has no bare fp8: the table maps it)
