"""A stand-in for vLLM's and SGLang's servers in the managed-server tests (neither runs on these CPUs).

    python tests/standin_server.py vllm serve CHECKPOINT --max-num-seqs 8 ...
    python tests/standin_server.py sglang -m sglang.launch_server --model-path CHECKPOINT ...

It parses the engine's command line the way the engine does for the flags the tuning tables use: argparse
refuses an unknown flag or a value outside a `choices` list (exit 2, "error: unrecognized arguments" /
"invalid choice"), and the values the engine checks after parsing (vLLM's KV dtypes and quantization
methods, metavar-only on its command line; SGLang's speculative algorithm) fail as the engine fails (exit 1,
the engine's message). Then it serves tests/fake_openai_server.py's handler on the port from the argv.

Environment (tests write a wrapper executable that sets these and execs this script):
- STANDIN_RECORD: a file; each start appends {"pid": ..., "argv": [...]} as one JSON line, argv[0] being
  STANDIN_EXE (the wrapper's path, which stands where `vllm` or `python` would).
- STANDIN_MODE: "" serves; "crash-at-start" exits 1 after recording; "crash-after:N" dies on the completion
  request after the N-th (the fake server's own crash); "hang" listens but /health answers 503 for ever
  (a model that never loads).
- STANDIN_DROP: comma-separated flags this engine does not know (an older release than the table's).
- STANDIN_REQUEST_LOG: where completion bodies are appended (default: nowhere).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]

import fake_openai_server  # noqa: E402  (tests/ is put on the path just above)

from app.managed.sglang import SGLANG_KV_CACHE_DTYPES, SGLANG_QUANTIZATION_METHODS  # noqa: E402
from app.managed.vllm import VLLM_KV_CACHE_DTYPES, VLLM_QUANTIZATION_METHODS  # noqa: E402

# sglang fields/spec.py speculative_algorithm: the builtins (SpeculativeAlgorithm.from_string refuses others)
SGLANG_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")


class Parser(argparse.ArgumentParser):
    """argparse that leaves out the flags STANDIN_DROP names, so they are refused like any unknown one."""

    def __init__(self, prog: str, dropped: set[str]) -> None:
        super().__init__(prog=prog)
        self.dropped = dropped

    def flag(self, *names: str, **kwargs) -> None:
        if not self.dropped.intersection(names):
            self.add_argument(*names, **kwargs)

    def enable_disable(self, name: str) -> None:
        """vLLM 0.33's EnableDisableAction (utils/argparse_utils.py): --enable-x, --no-enable-x, --disable-x."""
        if name not in self.dropped:
            self.add_argument(name, action=argparse.BooleanOptionalAction)
            self.add_argument(name.replace("--enable-", "--disable-"), action="store_false",
                              dest=name.removeprefix("--").replace("-", "_"))


def vllm_args(argv: list[str], dropped: set[str]) -> argparse.Namespace:
    """`vllm serve [model_tag] [options]` (vllm/entrypoints/cli/serve.py, vllm/engine/arg_utils.py)."""
    if argv[:1] != ["serve"]:
        Parser("vllm", set()).error(f"argument subparser: invalid choice: {argv[:1]} (choose from 'serve')")
    p = Parser("vllm serve", dropped)
    p.add_argument("model_tag", nargs="?")
    p.flag("--host")
    p.flag("--port", type=int, default=8000)
    p.flag("--served-model-name", nargs="+")
    p.flag("--max-num-seqs", type=int)
    p.flag("--quantization", "-q")
    p.flag("--kv-cache-dtype", default="auto")
    p.flag("--speculative-config", "-sc", type=json.loads)
    for switch in ("--enable-chunked-prefill", "--enable-prefix-caching"):
        p.enable_disable(switch)
    args = p.parse_args(argv[1:])
    kv = getattr(args, "kv_cache_dtype", "auto")
    if kv not in VLLM_KV_CACHE_DTYPES:  # vllm/config/cache.py CacheConfig._validate_cache_dtype
        fail(f"Invalid kv_cache_dtype: {kv!r}. Valid values are: {list(VLLM_KV_CACHE_DTYPES)}")
    quant = getattr(args, "quantization", None)
    if quant is not None and quant not in VLLM_QUANTIZATION_METHODS:  # vllm/config/model.py
        fail(f"Unknown quantization method: {quant}. Must be one of {list(VLLM_QUANTIZATION_METHODS)}.")
    if getattr(args, "max_num_seqs", None) is not None and args.max_num_seqs < 1:  # SchedulerConfig ge=1
        fail("max_num_seqs: Input should be greater than or equal to 1")
    spec = getattr(args, "speculative_config", None)
    if spec is not None and not (isinstance(spec.get("num_speculative_tokens"), int)
                                 and spec["num_speculative_tokens"] > 0):  # SpeculativeConfig Field gt=0
        fail("num_speculative_tokens: Input should be greater than 0")
    return args


def sglang_args(argv: list[str], dropped: set[str]) -> argparse.Namespace:
    """`python -m sglang.launch_server` (sglang/srt/arg_groups/fields/*.py via server_args.py)."""
    if argv[:2] != ["-m", "sglang.launch_server"]:
        fail(f"No module named {argv[1:2]} (expected -m sglang.launch_server)")
    p = Parser("sglang serve", dropped)  # server_args.py prepare_server_args
    p.flag("--model-path", "--model", required=True)
    p.flag("--host", default="127.0.0.1")
    p.flag("--port", type=int, default=30000)
    p.flag("--served-model-name")
    p.flag("--max-running-requests", type=int)
    p.flag("--quantization", choices=SGLANG_QUANTIZATION_METHODS)
    p.flag("--kv-cache-dtype", default="auto", choices=SGLANG_KV_CACHE_DTYPES)
    p.flag("--speculative-algorithm")
    p.flag("--speculative-draft-model-path", "--speculative-draft-model")
    for name in ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                 "--chunked-prefill-size"):
        p.flag(name, type=int)
    p.flag("--disable-radix-cache", action="store_true")
    args = p.parse_args(argv[2:])
    algorithm = getattr(args, "speculative_algorithm", None)
    if algorithm is not None and algorithm.upper() not in SGLANG_SPEC_ALGORITHMS:  # spec_info.py from_string
        fail(f"Unknown speculative algorithm name: {algorithm}")
    return args


def fail(message: str) -> None:
    print(f"ValueError: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def standin_handler(mode: str, model: str):
    """The fake server's handler, with the failure the mode asks for (it counts and crashes itself)."""
    crash_after = int(mode.split(":")[1]) if mode.startswith("crash-after:") else 0
    base = fake_openai_server.make_handler(os.environ.get("STANDIN_REQUEST_LOG", os.devnull), name=model,
                                           crash_after=crash_after)

    class StandinHandler(base):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if mode == "hang" and self.path == "/health":
                return self._send(503, {"status": "loading"})
            super().do_GET()

    return StandinHandler


def served_name(args: argparse.Namespace) -> str:
    """The name /v1/models answers: --served-model-name (a list on vLLM), else the checkpoint."""
    served = getattr(args, "served_model_name", None)
    if isinstance(served, list):
        served = served[0]
    return served or getattr(args, "model_tag", None) or getattr(args, "model_path", "standin")


def main() -> None:
    engine, argv = sys.argv[1], sys.argv[2:]
    dropped = {f for f in os.environ.get("STANDIN_DROP", "").split(",") if f}
    args = vllm_args(argv, dropped) if engine == "vllm" else sglang_args(argv, dropped)
    record = {"pid": os.getpid(), "argv": [os.environ.get("STANDIN_EXE", engine), *argv]}
    with open(os.environ["STANDIN_RECORD"], "a") as f:
        f.write(json.dumps(record) + "\n")
    mode = os.environ.get("STANDIN_MODE", "")
    if mode == "crash-at-start":
        print("RuntimeError: stand-in crashed while loading (STANDIN_MODE=crash-at-start)", flush=True)
        sys.exit(1)
    model = served_name(args)
    print(f"standin {engine}: serving {model} on 127.0.0.1:{args.port}", flush=True)
    fake_openai_server.serve(args.port, standin_handler(mode, model))


if __name__ == "__main__":
    main()
