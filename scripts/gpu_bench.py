"""Decode speed on one device, figure by figure: the GPU check's benches (scripts/gpu_check.py).

    python scripts/gpu_bench.py ours --model M --device cuda --json bench_decode.json [--streams 1 8 64]
    python scripts/gpu_bench.py hf   --model M --device cuda --json bench_hf.json   [--streams 1 8 64]

`ours`: one engine as a GPU user gets it (the Triton kernels and CUDA graphs on by default), decoding
--streams requests at once in alternating rounds of two modes: "eager" (cuda_graphs off) and "graphs". A
measure starts once every request has its first token (prefill left out) and ends with the last token:
decode tokens a second of all streams together, and ms a step. Then, per mode, one profiled window of decode
steps (torch.profiler: the GPU kernels a step runs and the time the GPU is busy in them, beside the step's
wall time) and the launches of one step counted from the code (engine/kernels/gpu/launches.py), and the
engine's memory breakdown (weights, KV blocks, the graphs' pool, the activations' measured peak, free).

`hf`: Hugging Face transformers on the same weights and device, the same decode measure (generate T tokens
minus generate 1, per batch of --streams): eager (dynamic cache), then a static cache with its forward pass
compiled (torch.compile, "reduce-overhead": CUDA graphs), the fastest setup transformers offers.

The JSON is rewritten after every figure, so a run stopped at its limit keeps every figure it reached (the
first GPU run's benches wrote nothing when stopped). Each figure says what it is: measured, or counted."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TEXT = ("Paged attention stores keys and values in blocks; continuous batching schedules every step; "
        "prefill reads the prompt and decode writes one token at a time. ")


class Results:
    """A JSON document written whole after every change (to a temporary name, then renamed: a reader never
    sees half a file)."""

    def __init__(self, path: Path, head: dict) -> None:
        self.path, self.doc = path, dict(head)
        self.save()

    def put(self, *keys: str, value) -> None:
        node = self.doc
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=2) + "\n")
        os.replace(tmp, self.path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("side", choices=["ours", "hf"])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--json", required=True)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--tokens", type=int, default=128, help="tokens each stream generates")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of the modes (median)")
    p.add_argument("--profile-steps", type=int, default=8)
    p.add_argument("--attention-backend", default="native", help="native: the Triton kernels on CUDA")
    p.add_argument("--max-model-len", type=int, default=None, help="the model's context length when not given")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--no-compile", action="store_true", help="hf: leave the compiled static-cache setup out")
    return p.parse_args(argv)


def _prompts(n: int, prompt_tokens: int) -> list[str]:
    words = (TEXT * (1 + prompt_tokens // 8)).split()
    return [f"{i}: " + " ".join(words[i % 7 : i % 7 + max(1, prompt_tokens - 2)]) for i in range(n)]


def decode_run(eng, prompts: list[str], tokens: int) -> dict:
    """One measure (see the module doc): every stream's decode, timed from its last first token."""
    from engine import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    ids = [eng.add_request(p, params) for p in prompts]
    produced = dict.fromkeys(ids, 0)
    while min(produced.values()) < 1:
        for out in eng.step():
            produced[out.request_id] = len(out.token_ids)
    start, steps, first = time.perf_counter(), 0, sum(produced.values())
    while eng.has_unfinished():
        for out in eng.step():
            produced[out.request_id] = len(out.token_ids)
        steps += 1
    seconds = time.perf_counter() - start
    decoded = sum(produced.values()) - first
    return {"decode_tokens": decoded, "seconds": round(seconds, 4), "steps": steps,
            "tokens_per_s": round(decoded / seconds, 1) if seconds > 0 else None,
            "ms_per_step": round(1e3 * seconds / steps, 3) if steps else None}


def profile_steps(eng, prompts: list[str], steps: int) -> dict:
    """GPU kernels and busy time of decode steps (torch.profiler), and one step's launches counted from the
    code. On the CPU only the count and the wall time are given."""
    import torch

    from engine import SamplingParams
    from engine.kernels.gpu.launches import counting

    params = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
    ids = [eng.add_request(p, params) for p in prompts]
    for _ in range(3):  # prompts in, every request decoding
        eng.step()
    with counting() as count:
        eng.step()
    result = {"launches_counted_from_the_code": {"total": count.total, "by_kernel": dict(count.kernels)}}
    cuda = eng.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.step()
        wall = time.perf_counter() - t0
    for rid in ids:  # the rest of their tokens are no figure
        eng.abort(rid)
    while eng.has_unfinished():
        eng.step()
    result["wall_ms_per_step"] = round(1e3 * wall / steps, 3)
    if cuda:
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy_us = sum(e.device_time for e in kernels)
        result.update(profiled_kernels_per_step=round(len(kernels) / steps, 1),
                      gpu_busy_ms_per_step=round(busy_us / 1e3 / steps, 4),
                      wall_over_busy=round(wall * 1e6 / busy_us, 2) if busy_us else None)
    return result


def run_ours(args, results: Results) -> None:
    from engine import EngineConfig, LLMEngine

    t0 = time.perf_counter()
    eng = LLMEngine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                                 attention_backend=args.attention_backend, max_num_seqs=max(args.streams),
                                 max_model_len=args.max_model_len,
                                 gpu_memory_utilization=args.gpu_memory_utilization,
                                 # the CPU (the dry run): a small cache, which Triton's interpreter copies
                                 # to and from the host at every launch that takes it
                                 kv_cache_memory_bytes=None if args.device.startswith("cuda") else 4 * 2**20))
    graphs = eng.runner.graphs
    results.put("engine", value={
        "build_seconds": round(time.perf_counter() - t0, 2), "line": eng.compute_line(),
        "attention_backend": eng.runner.backend.name, "triton_kernels": eng.runner.backend.triton is not None,
        "graphs_startup_buckets": graphs.startup_buckets if graphs else [],
        "graphs_capture_error": graphs.capture_error if graphs else None, "max_model_len": eng.max_model_len})
    results.put("memory", value={**dataclasses.asdict(eng.memory()), "note": "measured: the engine's memory "
                                 "breakdown after start-up (graphs' pool and activations' peak measured on CUDA)"})
    modes = {"eager": False, "graphs": True}
    for streams in args.streams:
        prompts = _prompts(streams, args.prompt_tokens)
        for on in modes.values():  # warm-up: each mode once (kernels compiled, graphs built)
            eng.reconfigure(cuda_graphs=on)
            decode_run(eng, prompts, min(args.tokens, 8))
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for _ in range(args.rounds):
            for mode, on in modes.items():
                eng.reconfigure(cuda_graphs=on)
                runs[mode].append(decode_run(eng, prompts, args.tokens))
                med = statistics.median(r["tokens_per_s"] for r in runs[mode])
                results.put("decode", f"{streams}_streams", mode,
                            value={"median_tokens_per_s": med, "runs": runs[mode], "measured": True})
    for mode, on in modes.items():
        eng.reconfigure(cuda_graphs=on)
        results.put("profile", mode, value=profile_steps(eng, _prompts(1, args.prompt_tokens),
                                                           args.profile_steps))
    g = eng.runner.graphs
    results.put("engine", "graphs_after", value={"replays": g.num_replays if g else 0,
                                                 "captures": g.num_captures if g else 0,
                                                 "pool_bytes": g.pool_bytes if g else 0})


def run_hf(args, results: Results) -> None:
    import torch
    import transformers

    dtype = torch.bfloat16 if args.dtype == "auto" else getattr(torch, args.dtype)
    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
    results.put("hf", "transformers", value=transformers.__version__)

    def sync() -> None:
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)

    @torch.inference_mode()
    def timed(ids, new: int, **kw) -> float:
        sync()
        t = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, pad_token_id=0, **kw)
        sync()
        return time.perf_counter() - t

    setups = [("eager_dynamic_cache", {})]
    if not args.no_compile:
        setups.append(("static_cache_compiled", {"cache_implementation": "static"}))
    for name, kw in setups:
        if name == "static_cache_compiled":
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        for streams in args.streams:
            # one prompt repeated: a static batch with no padding (decode speed does not depend on the text)
            ids = tok(_prompts(1, args.prompt_tokens)[0], return_tensors="pt").input_ids.repeat(streams, 1)
            ids = ids.to(model.device)
            t_compile = time.perf_counter()
            timed(ids, args.tokens, **kw)  # warm-up (and the compile, for the compiled setup)
            timed(ids, 1, **kw)
            warm = time.perf_counter() - t_compile
            runs = []
            for _ in range(args.rounds):
                whole, first = timed(ids, args.tokens, **kw), timed(ids, 1, **kw)
                decode_s = max(whole - first, 1e-9)
                runs.append({"seconds": round(decode_s, 4),
                             "tokens_per_s": round(streams * (args.tokens - 1) / decode_s, 1)})
                results.put("hf", name, f"{streams}_streams", value={
                    "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs), "runs": runs,
                    "warm_up_seconds": round(warm, 2), "measured": True})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    head = {"side": args.side, "model": args.model, "device": args.device, "torch": torch.__version__,
            "streams": args.streams, "tokens_per_stream": args.tokens, "rounds": args.rounds,
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if torch.cuda.is_available() and args.device.startswith("cuda"):
        head["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    results = Results(Path(args.json), head)
    (run_ours if args.side == "ours" else run_hf)(args, results)
    results.put("finished", value=time.strftime("%Y-%m-%d %H:%M:%S"))
    print(json.dumps({k: results.doc.get(k) for k in ("decode", "hf") if k in results.doc}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
