"""The one patch scripts/build_llama_cpp.sh applies to llama.cpp (scripts/patch_llama_cpp.py): a compiler
barrier that keeps GCC from dropping the stores of ggml's AMX tile configuration (llama.cpp issue 20824),
and what the bench JSON says of the llama.cpp it measured (VERSION, read by llama_cpp_build)."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import llama_cpp_peer
import pytest

from app.bench import llama_cpp
from engine.kernels import cpu_flags

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("patch_llama_cpp", ROOT / "scripts" / "patch_llama_cpp.py")
patcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(patcher)

# ggml_tile_config_init as llama-cpp-python 0.3.36 vendors it (the shape the patch looks for), trimmed to
# what the patch touches: a configuration filled on the stack, then loaded.
UPSTREAM = """#include <immintrin.h>
#include <cstdint>
struct tile_config_t {
    uint8_t palette_id = 0;
    uint8_t start_row = 0;
    uint8_t reserved_0[14] = {0};
    uint16_t colsb[16] = {0};
    uint8_t rows[16] = {0};
};

inline void ggml_tile_config_init(void) {
    static thread_local bool done = false;

    if (done) {
        return;
    }

    alignas(64) tile_config_t tc = {};
    tc.palette_id = 1;
    tc.start_row = 0;
    tc.rows[0] = 8;   tc.colsb[0] = 64;
    tc.rows[1] = 8;   tc.colsb[1] = 64;
    tc.rows[2] = 16;  tc.colsb[2] = 32;
    tc.rows[3] = 16;  tc.colsb[3] = 32;
    tc.rows[4] = 16;  tc.colsb[4] = 64;

    _tile_loadconfig(&tc);
    done = true;
}
"""

# Loads the configuration as ggml does, then reads back what the CPU holds (sttilecfg) and prints it.
MAIN = """
#include <cstdio>
#include <unistd.h>
#include <sys/syscall.h>
int main() {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 3;
    ggml_tile_config_init();
    alignas(64) tile_config_t back = {};
    _tile_storeconfig(&back);
    for (int i = 0; i < 5; ++i) std::printf("%d:%d ", back.rows[i], back.colsb[i]);
    _tile_release();
    return 0;
}
"""


def _tree(tmp_path: Path, text: str | None) -> Path:
    src = tmp_path / "llama.cpp"
    (src / patcher.MMQ).parent.mkdir(parents=True)
    if text is not None:
        (src / patcher.MMQ).write_text(text)
    return src


def test_the_patch_puts_a_barrier_before_the_load_once(tmp_path):
    src = _tree(tmp_path, UPSTREAM)
    assert patcher.patch_amx_tile_config(src) == "patched"
    once = (src / patcher.MMQ).read_text()
    barrier_at, load_at = once.index("__asm__ __volatile__"), once.index("_tile_loadconfig(&tc);")
    assert barrier_at < load_at and once.count("_tile_loadconfig") == 1
    assert once.replace(patcher.BARRIER, "") == UPSTREAM  # nothing else changed
    assert patcher.patch_amx_tile_config(src) == "kept"
    assert (src / patcher.MMQ).read_text() == once


def test_a_tree_without_that_code_is_left_alone(tmp_path):
    assert patcher.patch_amx_tile_config(_tree(tmp_path / "a", None)) == "absent"
    other = UPSTREAM.replace("    _tile_loadconfig(&tc);\n", "    load_it(&tc);\n")
    src = _tree(tmp_path / "b", other)
    assert patcher.patch_amx_tile_config(src) == "absent"
    assert (src / patcher.MMQ).read_text() == other


def test_the_command_line_says_what_it_did(tmp_path):
    src = _tree(tmp_path, UPSTREAM)
    script = [shutil.which("python3") or "python3", str(ROOT / "scripts" / "patch_llama_cpp.py")]
    said = [subprocess.run([*script, str(src)], capture_output=True, text=True, check=True).stdout.strip()
            for _ in range(2)]
    assert said == ["patched", "kept"]
    assert subprocess.run(script, capture_output=True, text=True).returncode == 2


def _compile(tmp_path: Path, text: str, name: str) -> Path:
    source = tmp_path / f"{name}.cpp"
    source.write_text(text + MAIN)
    binary = tmp_path / name
    proc = subprocess.run(["g++", "-O2", "-mamx-tile", "-mamx-int8", str(source), "-o", str(binary)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"g++ cannot build AMX code here: {proc.stderr.strip()[-200:]}")
    return binary


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_the_patched_configuration_reaches_the_cpu(tmp_path):
    """Built by this machine's g++ (the compiler that builds llama.cpp here), the patched function loads the
    whole configuration: read back from the CPU, every tile's rows and width are the ones ggml set. Runs
    where the CPU has AMX; elsewhere only the build is checked."""
    src = _tree(tmp_path, UPSTREAM)
    patcher.patch_amx_tile_config(src)
    binary = _compile(tmp_path, (src / patcher.MMQ).read_text(), "patched")
    if "amx_tile" not in cpu_flags():
        pytest.skip("this CPU has no AMX: the patched code was built, not run")
    proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc
    assert proc.stdout.split() == ["8:64", "8:64", "16:32", "16:32", "16:64"]


def test_the_build_description_keeps_known_keys_only(tmp_path):
    assert "version_file" in llama_cpp.llama_cpp_build(tmp_path)  # no VERSION: said, not raised
    (tmp_path / "VERSION").write_text("sdist: llama_cpp_python-0.3.36.tar.gz\nisa: native\n"
                                      "patch: amx-tile-config (...)\nrm -rf: /\nisa: avx2\n"
                                      "built: " + "x" * 5000 + "\n")
    build = llama_cpp.llama_cpp_build(tmp_path)
    assert build == {"sdist": "llama_cpp_python-0.3.36.tar.gz", "isa": "native", "patch": "amx-tile-config (...)",
                     "built": "x" * 200}
    (tmp_path / "VERSION").write_bytes(b"\xff\xfe isa: \x00native\n")
    assert set(llama_cpp.llama_cpp_build(tmp_path)) <= set(llama_cpp.BUILD_KEYS)


@pytest.mark.llama_cpp
def test_the_built_llama_cpp_runs_a_4_bit_prompt_with_its_repacked_weights():
    """Where the build carries the patch and the CPU has AMX, the 4-bit prompt that used to die in ggml's AMX
    product (repacked Q4_1, llama-bench -p 8) runs."""
    binary = llama_cpp_peer.tool("llama-bench")
    if not llama_cpp.llama_cpp_build().get("patch", "").startswith("amx-tile-config"):
        pytest.skip("this llama.cpp build has no AMX patch (built before it, or another version)")
    run = llama_cpp.llama_bench(binary, llama_cpp_peer.default_q4_gguf(), threads=1, n_gen=2, n_prompt=8, repack=True)
    assert run["prefill_tokens_per_s"] > 0 and run["decode_tokens_per_s"] > 0
