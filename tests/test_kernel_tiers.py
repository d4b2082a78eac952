"""The native kernels' ISA tiers (engine/kernels): which tier a CPU runs, the torch-free harness of every
body (engine/kernels/harness/check_kernels.cpp) built for each x86 tier this CPU runs and for Arm NEON
(cross-compiled, run under qemu-aarch64), and the engine on torch's kernels where no compiler works."""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import kernels
from engine.kernels import build, detect, load, tier_choice

KERNELS = Path(kernels.__file__).parent
HARNESS = KERNELS / "harness" / "check_kernels.cpp"
AVX512 = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
                    "avx512_vnni"})


def test_tiers_follow_the_cpus_flags():
    assert kernels.supported_tiers(AVX512, "x86_64") == ("portable", "avx2", "avx512")
    # AVX-512 without bf16 dot products (Skylake-X, Ice Lake): the AVX2 body
    assert kernels.supported_tiers(AVX512 - {"avx512_bf16"}, "x86_64") == ("portable", "avx2")
    assert kernels.supported_tiers(frozenset({"avx2", "fma", "f16c", "sse4_2"}), "x86_64") == ("portable", "avx2")
    assert kernels.supported_tiers(frozenset({"avx2", "sse4_2"}), "x86_64") == ("portable",)  # no FMA
    assert kernels.supported_tiers(frozenset({"fp", "asimd"}), "aarch64") == ("portable", "neon")
    assert kernels.supported_tiers(frozenset(), "riscv64") == ("portable",)


def test_the_flags_are_those_the_cpu_confirms(monkeypatch):
    """/proc/cpuinfo can list what the CPU does not run (qemu-user shows the host's file to an emulated
    CPU): on x86 a flag CPUID denies is dropped, with one warning, so no kernel for it is built or run."""
    listed = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512_bf16", "sse4_2", "some_new_flag"})
    cpuid = {"avx2": True, "fma3": True, "f16c": True, "sse4_2": True, "avx512_f": False, "avx512_bf16": False}
    monkeypatch.setattr(detect, "_listed_flags", lambda: listed)
    monkeypatch.setattr(detect, "_cpuid_capabilities", lambda: cpuid)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    with pytest.warns(UserWarning, match="lists avx512_bf16, avx512f but this CPU does not run them"):
        flags = kernels.cpu_flags.__wrapped__()
    assert flags == {"avx2", "fma", "f16c", "sse4_2", "some_new_flag"}  # what CPUID does not know stays
    assert kernels.supported_tiers(flags, "x86_64") == ("portable", "avx2")
    # no /proc/cpuinfo (Windows, macOS on Intel): the flags from CPUID alone
    monkeypatch.setattr(detect, "_listed_flags", lambda: frozenset())
    assert kernels.cpu_flags.__wrapped__() == {"avx2", "fma", "f16c", "sse4_2"}
    # no probe in this torch: the file is trusted
    monkeypatch.setattr(detect, "_listed_flags", lambda: listed)
    monkeypatch.setattr(detect, "_cpuid_capabilities", lambda: None)
    assert kernels.cpu_flags.__wrapped__() == listed
    # aarch64 Linux: the kernel's hardware-capability words confirm (qemu-aarch64 shows an x86 host's file:
    # its "flags" line is not read there, so the flags come from the words alone)
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(detect, "_hwcap_words", lambda: {16: 1 << 0 | 1 << 1 | 1 << 20, 26: 0})
    monkeypatch.setattr(detect, "_listed_flags", lambda: frozenset({"fp", "asimd", "asimddp", "bf16", "atomics"}))
    with pytest.warns(UserWarning, match="lists bf16 but this CPU does not run them .hardware capabilities"):
        assert kernels.cpu_flags.__wrapped__() == {"fp", "asimd", "asimddp", "atomics"}
    monkeypatch.setattr(detect, "_listed_flags", lambda: frozenset())
    assert kernels.cpu_flags.__wrapped__() == {"fp", "asimd", "asimddp"}
    monkeypatch.setattr(detect, "_hwcap_words", lambda: None)  # not Linux: what the file (or sysctl) says
    assert kernels.cpu_flags.__wrapped__() == frozenset()


def test_the_neon_tier_says_whether_it_has_sdot(monkeypatch):
    monkeypatch.setattr(detect, "cpu_flags", lambda: frozenset({"asimd", "asimddp"}))
    assert kernels.describe_tier("neon") == "neon (Arm NEON + sdot)"
    monkeypatch.setattr(detect, "cpu_flags", lambda: frozenset({"asimd"}))
    assert kernels.describe_tier("neon") == "neon (Arm NEON)"
    assert kernels.describe_tier("avx2") == "avx2 (AVX2 + FMA)"


def test_the_file_is_read_for_this_architecture_only(monkeypatch, tmp_path):
    """Under qemu-aarch64 on an x86 host /proc/cpuinfo is the host's: its x86 "flags" (avx512_bf16, ...)
    must not reach an Arm engine's choices, nor Arm "Features" an x86 one's."""
    text = "processor\t: 0\nflags\t\t: avx2 avx512_bf16\nFeatures\t: asimd bf16\n"
    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text if str(self) == "/proc/cpuinfo"
                        else real_read(self, *a, **k))
    for machine, expected in (("aarch64", {"asimd", "bf16"}), ("x86_64", {"avx2", "avx512_bf16"})):
        monkeypatch.setattr(platform, "machine", lambda m=machine: m)
        assert detect._listed_flags.__wrapped__() == expected


def test_this_machines_flags_are_confirmed():
    """On a plain machine the file and CPUID agree: nothing dropped (the bench JSON's flags_not_confirmed)."""
    from engine.perf.probe import cpu_description

    assert kernels.unconfirmed_flags() == frozenset()
    assert cpu_description()["flags_not_confirmed"] == []


def test_a_lower_tier_can_be_forced_and_a_higher_one_is_refused(monkeypatch):
    best = kernels.supported_tiers()[-1]
    monkeypatch.setenv("INFERLAB_CPU_TIER", "portable")
    assert kernels.cpu_tier() == "portable"
    monkeypatch.setenv("INFERLAB_CPU_TIER", "sse9")
    with pytest.warns(UserWarning, match="INFERLAB_CPU_TIER='sse9'"):
        assert kernels.cpu_tier() == best
    with pytest.raises(ValueError, match="unknown CPU tier"):
        kernels.kernel_module(tier="sse9")


def _compile_and_run(compiler: str, flags: list[str], out: Path, runner: list[str]) -> str:
    subprocess.run([compiler, "-O2", "-std=c++17", *flags, f"-I{KERNELS}", str(HARNESS), "-o", str(out)],
                   check=True, capture_output=True, text=True, timeout=300)
    done = subprocess.run([*runner, str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 failed" in done.stdout
    return done.stdout


@pytest.mark.parametrize("tier", kernels.supported_tiers())
def test_the_harness_passes_on_every_tier_this_cpu_runs(tier, tmp_path):
    """Every body against the double-precision reference, built with the tier's own flags (so CI on an
    AVX-512 machine checks the AVX2 body too); the binary says which body it ran."""
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    out = _compile_and_run(compiler, build.tier_flags(tier), tmp_path / "check", [])
    assert f"tier: {tier}" in out


@pytest.mark.parametrize("flags", [["-march=armv8.2-a+dotprod"], ["-march=armv8-a"]], ids=["sdot", "no-sdot"])
def test_the_neon_body_passes_under_qemu(flags, tmp_path):
    """The NEON body (with and without sdot) cross-compiled for AArch64 and run under qemu-aarch64-static:
    .ci/run installs g++-aarch64-linux-gnu and qemu-user-static; skipped only where they are missing."""
    cross, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64-static")
    if cross is None or qemu is None:
        pytest.skip("needs g++-aarch64-linux-gnu and qemu-user-static (apt-get install them)")
    out = _compile_and_run(cross, ["-static", *flags], tmp_path / "check-arm", [qemu])
    assert "tier: neon" in out


def test_without_a_compiler_the_engine_runs_on_torchs_kernels(tmp_path, monkeypatch):
    """A compiler that fails (as on macOS without OpenMP): one warning line, no traceback, None; an
    engine then generates on torch's kernels."""
    import torch._inductor.config  # noqa: F401  reads CXX once, at import: not the failing one set below

    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setattr(build, "_source_digest", lambda: "nocompiler")  # a build no cache holds
    monkeypatch.setattr(kernels, "_BUILT", {})
    monkeypatch.setattr(build, "FAILED", {})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    with pytest.warns(UserWarning, match="running on torch's kernels") as caught:
        assert kernels.kernel_module(tier="portable") is None
    assert len([w for w in caught if "native kernels" in str(w.message)]) == 1
    assert "\n" not in str(caught[0].message)
    assert kernels.status("portable").startswith("unavailable")

    from engine import EngineConfig, LLMEngine, SamplingParams
    from tests.conftest import build_tiny_model

    folder = build_tiny_model(tmp_path / "m", head_dim=64, num_attention_heads=2, num_key_value_heads=1)
    monkeypatch.setenv("INFERLAB_CPU_TIER", "portable")
    eng = LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", num_kv_blocks=16))
    assert eng.runner.fused is None and eng.runner.native_decode is None
    out = eng.generate(["hello"], SamplingParams(max_tokens=4, temperature=0.0))
    assert len(out[0].token_ids) == 4


def test_a_background_build_hands_the_kernels_over_between_steps(tmp_path, monkeypatch, request):
    """kernel_build="background": the engine starts on torch's kernels while the build runs, and the
    native ones (fused step, native attention) take over at a step after it is done."""
    import threading

    from engine import EngineConfig, LLMEngine, SamplingParams
    from tests.conftest import build_tiny_model

    tier = kernels.cpu_tier()
    real = kernels.kernel_module(tier=tier)  # built (or loaded) now; the test holds its "build" back
    if real is None:
        pytest.skip("no C++ toolchain to build the kernels")
    name = build.build_name(tier)
    release = threading.Event()

    def slow_compile(build_name, build_tier):  # under the build lock, as a real compile
        release.wait(60)
        return real

    monkeypatch.setattr(kernels, "_BUILT", {})
    monkeypatch.setattr(kernels, "_PENDING", {})
    monkeypatch.setattr(load, "import_built", lambda n, locked=False: None)  # as on a machine that never built it
    # its tiers' timing (every "build" is `real`) is stored in a cache of its own, not the machine's
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    tier_choice.forget()
    request.addfinalizer(tier_choice.forget)
    monkeypatch.setattr(build, "compile_build", slow_compile)
    folder = build_tiny_model(tmp_path / "m", head_dim=64, num_attention_heads=2, num_key_value_heads=1)
    eng = LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", num_kv_blocks=16, kernel_build="background"))
    assert kernels.build_pending(tier) and eng.runner.fused is None
    first = eng.generate(["hello"], SamplingParams(max_tokens=3, temperature=0.0))
    assert eng.runner.fused is None and len(first[0].token_ids) == 3
    release.set()
    assert kernels._PENDING[name].result(timeout=60) is real
    if kernels._CHOICE_KEY in kernels._PENDING:  # every tier built and timed first (engine/kernels/tier_choice.py)
        kernels._PENDING[kernels._CHOICE_KEY].result(timeout=300)
    eng.generate(["hello again"], SamplingParams(max_tokens=3, temperature=0.0))
    assert eng.runner.fused is not None and eng.runner.native_decode is not None


@pytest.mark.parametrize("openmp", [["-fopenmp"], []], ids=["openmp", "own-threads"])
def test_the_whole_module_compiles_for_aarch64(openmp):
    """The torch side too (the fused step's barrier, the bindings) compiles for AArch64 with the NEON body:
    a syntax-only cross-compile against this torch's headers (they are the same on every architecture);
    with OpenMP, and without it as on macOS (the kernels' own thread pool, threads.h)."""
    import sysconfig

    import torch

    cross = shutil.which("aarch64-linux-gnu-g++")
    if cross is None:
        pytest.skip("needs g++-aarch64-linux-gnu (apt-get install it)")
    torch_inc = Path(torch.__file__).parent / "include"
    done = subprocess.run([cross, "-fsyntax-only", "-std=c++17", "-march=armv8.2-a+dotprod", *openmp,
                           f"-I{torch_inc}", f"-I{torch_inc / 'torch' / 'csrc' / 'api' / 'include'}",
                           f"-I{sysconfig.get_paths()['include']}", "-DTORCH_EXTENSION_NAME=inferlab_check",
                           str(KERNELS / "module.cpp")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.skipif(not {"avx2", "fma", "f16c"} <= kernels.cpu_flags(), reason="needs an x86 CPU with AVX2")
def test_as_avx2_caps_inferlab_and_torch_alike():
    """scripts/as_avx2.sh: inferlab's AVX2 tier and emulated bf16, and torch's own dispatch (ATen, and
    through it inductor's generated code) at AVX2, in the command it runs."""
    root = Path(__file__).resolve().parent.parent
    code = ("import torch; from engine.kernels import cpu_tier; from engine.runner.cpu_compute import "
            "emulated_bf16_forced, plan_compute; print(cpu_tier(), emulated_bf16_forced(), "
            "torch.backends.cpu.get_cpu_capability(), plan_compute('auto', torch.device('cpu')).matmul_dtype)")
    done = subprocess.run([str(root / "scripts" / "as_avx2.sh"), sys.executable, "-c", code], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["avx2", "True", "AVX2", "torch.float32"]


# ------------------------------------------------------------------ other x86 CPUs, emulated by qemu-x86_64
# qemu's CPU model -> the tier it must get, what torch must see there, and the environment that makes this
# CPU run the same code natively (scripts/as_avx2.sh's for AVX2). Every instruction runs under the model's
# feature set, so an AVX-512 instruction in the AVX2 path (or an AVX one in the portable path) kills the
# process (SIGILL), and the detection meets a CPU that really lacks the features: qemu-user shows the host's
# /proc/cpuinfo, which lists AVX-512 here, while CPUID says what the emulated CPU runs.
_AS_AVX2 = {"INFERLAB_CPU_TIER": "avx2", "INFERLAB_EMULATED_BF16": "1", "ATEN_CPU_CAPABILITY": "avx2",
            "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
_AS_PORTABLE = {"INFERLAB_CPU_TIER": "portable", "INFERLAB_EMULATED_BF16": "1", "ATEN_CPU_CAPABILITY": "default",
                "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
_EMULATED = {"EPYC-Milan": ("avx2", "AVX2", _AS_AVX2),  # Zen 3, the CPU of issue 24: AVX2, FMA, F16C, no AVX-512
             "Nehalem": ("portable", "DEFAULT", _AS_PORTABLE)}  # SSE4.2, no AVX at all


_ROOT = Path(__file__).resolve().parent.parent


def _runner(folder: Path) -> tuple[list[str], dict[str, str]]:
    """tests/emulated_cpu_run.py over `folder`, and an environment with nothing forced."""
    plain = {k: v for k, v in os.environ.items() if k not in _AS_AVX2}
    plain["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), plain.get("PYTHONPATH")]))
    return [str(Path(__file__).parent / "emulated_cpu_run.py"), str(folder)], plain


def _result(cmd: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=_ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def _qemu_x86(tier: str) -> str:
    qemu = shutil.which("qemu-x86_64-static") or shutil.which("qemu-x86_64")
    if qemu is None or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("needs an x86-64 machine and qemu-user-static (apt-get install it)")
    if tier not in kernels.supported_tiers():
        pytest.skip(f"this CPU does not run the {tier} tier natively")
    return qemu


@pytest.mark.parametrize("model", list(_EMULATED))
def test_the_harness_passes_on_an_emulated_cpu_without_the_higher_tiers(model, tmp_path):
    tier = _EMULATED[model][0]
    qemu = _qemu_x86(tier)
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    out = _compile_and_run(compiler, build.tier_flags(tier), tmp_path / "check", [qemu, "-cpu", model])
    assert f"tier: {tier}" in out


def test_the_emulator_refuses_what_its_cpu_lacks(tmp_path):
    """The control for the two tests around it: the AVX-512 body dies under the emulated Zen 3."""
    qemu = _qemu_x86("avx512")
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    out = tmp_path / "check"
    subprocess.run([compiler, "-O2", "-std=c++17", *build.tier_flags("avx512"), f"-I{KERNELS}", str(HARNESS),
                    "-o", str(out)], check=True, capture_output=True, text=True, timeout=300)
    done = subprocess.run([qemu, "-cpu", "EPYC-Milan", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Illegal instruction" in done.stderr


@pytest.mark.parametrize("model", list(_EMULATED))
def test_the_engine_on_an_emulated_cpu_finds_its_tier_and_gives_the_native_tokens(model, tmp_path):
    """The whole engine (torch included) on the emulated CPU, nothing forced: it must find its tier from the
    CPU itself (not the host's /proc/cpuinfo), plan fp32 prefill (no native bf16), run the fused step on that
    tier's kernels, and give at 16, 8 and 4 bits the tokens this machine gives forced to the same code."""
    from tests.conftest import build_tiny_model

    tier, capability, forced = _EMULATED[model]
    qemu = _qemu_x86(tier)
    if kernels.kernel_module(tier=tier) is None:  # built natively now: the emulated process loads it
        pytest.skip("no C++ toolchain to build the kernels")
    folder = build_tiny_model(tmp_path / "m", head_dim=64, num_attention_heads=2, num_key_value_heads=1)
    runner, plain = _runner(folder)
    native = _result([sys.executable, *runner], {**plain, **forced})
    emulated = _result([qemu, "-cpu", model, sys.executable, *runner], plain)
    assert emulated["tiers"] == list(kernels.TIERS[: kernels.TIERS.index(tier) + 1])
    assert (emulated["tier"], emulated["torch_capability"]) == (tier, capability)
    assert "no native bf16" in emulated["plan"] and emulated["fused"]
    assert native["tier"] == tier
    assert emulated["tokens"] == native["tokens"]


# ------------------------------------------------------------------------ Arm CPUs, emulated by qemu-aarch64
# scripts/arm_emulated.sh sets up an AArch64 Python with torch for aarch64 (.ci/run does, into this folder).
ARM_EMULATED = Path(os.environ.get("INFERLAB_ARM_EMULATED", Path.home() / ".cache" / "inferlab" / "arm-emulated"))
# qemu's CPU model -> (sdot, native bf16): Graviton 3/4 and Apple M2 on have both ("max"); Graviton 2, Ampere
# Altra and the Raspberry Pi 5 have sdot only (Cortex-A76, as Neoverse N1); A64FX has neither (ARMv8.2 + SVE).
_ARM = {"max": (True, True), "cortex-a76": (True, False), "a64fx": (False, False)}


@pytest.mark.parametrize("model, openmp", [*((m, True) for m in _ARM), ("max", False)],
                         ids=[*_ARM, "max-own-threads"])
def test_the_engine_on_an_emulated_arm_cpu_runs_neon_and_gives_the_reference_tokens(model, openmp, tmp_path):
    """The whole engine on AArch64 (torch for aarch64, the NEON kernels built by the cross compiler, the
    fused step) under qemu-aarch64 as `model`, nothing forced: the neon tier, sdot where the CPU has it
    (a separate build where it does not), the dtype plan from the CPU's own capability words (qemu shows the
    x86 host's /proc/cpuinfo), and at 16, 8 and 4 bits the tokens of this machine's portable kernels under
    the same plan. "max-own-threads": as on macOS with Apple silicon (Apple clang has no OpenMP), the build
    without OpenMP, its own pool's threads splitting the work at 2 threads."""
    from tests.conftest import build_tiny_model

    python = ARM_EMULATED / "python"
    if not python.exists():
        pytest.skip(f"no emulated Arm machine in {ARM_EMULATED} (scripts/arm_emulated.sh DIR sets one up)")
    sdot, native_bf16 = _ARM[model]
    folder = build_tiny_model(tmp_path / "m", head_dim=64, num_attention_heads=2, num_key_value_heads=1)
    runner, plain = _runner(folder)
    env = {**plain, "QEMU_CPU": model, **({} if openmp else {kernels.OPENMP_ENV: "0"})}
    emulated = _result([str(python), *runner, *([] if openmp else ["2"])], env)
    assert (emulated["tier"], emulated["tiers"], emulated["fused"]) == ("neon", ["portable", "neon"], True)
    assert emulated["openmp"] == openmp and (openmp or emulated["pool_threads"] >= 1)
    assert ("neon_sdot_" in emulated["build"]) == sdot and ("asimddp" in emulated["flags"]) == sdot
    assert emulated["described"] == f"neon (Arm NEON{' + sdot' if sdot else ''})"
    assert ("this CPU has native bf16 (bf16)" in emulated["plan"]) == native_bf16
    assert not {"avx2", "avx512f"} & set(emulated["flags"])  # the host's file is not read as Arm's
    reference = _result([sys.executable, *runner], {**plain, **_AS_PORTABLE, **(
        {"INFERLAB_EMULATED_BF16": "0"} if native_bf16 else {})})
    compared = ["bf16", "int8", "int4"]
    if native_bf16 and "native bf16" not in reference["plan"]:
        compared = ["bf16", "int8"]  # 4-bit prompt rows take the native-bf16 route only where the CPU has it
    assert {b: emulated["tokens"][b] for b in compared} == {b: reference["tokens"][b] for b in compared}
