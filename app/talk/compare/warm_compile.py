"""Compile a preset's torch.compile configurations ahead, on a core `inferlab prepare` does not measure on.

prepare measures with the app's thread count (on a 2-core machine 1 thread: one core is left to the GUI),
so during a prepare that core is idle. The compilation chapter's first run compiles the decode step cold:
~50 s at one thread as AVX2 on a Zen 4, mostly inductor's code generation and g++, on one core. A child
process started at the beginning of prepare builds the same engine configuration and runs the chapter's own
warm-up workload on that idle core, so that when prepare reaches the chapter (run last), its compile reads
torch's compile cache (~7 s here) instead of compiling again. What the chapter measures after its warm-up
is unchanged; its warm-up time (warmup_s) is then a warm cache's, and the result says so (its conditions).

    python -m app.talk.compare.warm_compile PRESET MODEL DTYPE DEVICE THREADS
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass


def compiled_configs(spec) -> list:
    """The configurations of a [compare] section that run torch.compile."""
    return [c for c in spec.configs if {**spec.engine, **c.knobs}.get("compile")]


def spare_cores(threads: int) -> int:
    """Cores this process may run on beyond the `threads` prepare measures with."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(cores - threads, 0)


@dataclass
class Background:
    """A warm-compile child process and where its output goes."""

    preset: str
    proc: subprocess.Popen
    log: tempfile._TemporaryFileWrapper
    started: float

    def wait(self) -> tuple[bool, float, str]:
        """(finished well, seconds since it started, the last lines of its output)."""
        rc = self.proc.wait()
        took = time.perf_counter() - self.started
        self.log.seek(0)
        tail = "\n".join(self.log.read().decode(errors="replace").strip().splitlines()[-3:])
        self.log.close()
        return rc == 0, took, tail


def start(preset: str, model: str, dtype: str, device: str, threads: int) -> Background:
    """The child process for `preset`, started now (niced, so it yields the measuring core if it shares it)."""
    log = tempfile.TemporaryFile()
    cmd = [sys.executable, "-m", "app.talk.compare.warm_compile", preset, model, dtype, device, str(threads)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=(lambda: os.nice(10)) if hasattr(os, "nice") else None)
    return Background(preset, proc, log, time.perf_counter())


def warm(preset_name: str, model: str, dtype: str, device: str, threads: int) -> None:
    """Build each compiled configuration of the preset's comparison as prepare does and run its warm-up."""
    import torch

    from app.load.generator import corpus_text
    from app.talk.compare.job import comparison_base
    from app.talk.compare.runner import _engine_config, _warm_up
    from app.talk.compare.workload import plan
    from app.talk.presets import load_preset
    from engine import LLMEngine
    from engine.loading.loader import load_model

    torch.set_num_threads(threads)
    spec = load_preset(preset_name).compare
    loaded = load_model(model)
    base = comparison_base(model, dtype, device, threads)
    corpus = loaded.tokenizer.encode(corpus_text(), add_special_tokens=False)
    planned = plan(spec.workload, corpus, min(loaded.config.max_position_embeddings, 2048))
    for c in compiled_configs(spec):
        engine = LLMEngine(_engine_config(base, spec, c), loaded=loaded)
        t0 = time.perf_counter()
        _warm_up(engine, spec, planned, corpus, lambda: False)
        print(f"{preset_name}: {c.label}: compiled and warmed up in {time.perf_counter() - t0:.1f} s", flush=True)
        del engine


if __name__ == "__main__":
    name, model_name, dtype_name, device_name, n_threads = sys.argv[1:6]
    warm(name, model_name, dtype_name, device_name, int(n_threads))
