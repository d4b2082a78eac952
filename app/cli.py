"""The `inferlab` command: the desktop app by default, plus generate / serve / tune / bench subcommands."""
from __future__ import annotations

import argparse
import sys
import textwrap

from app.device_args import APP_GPU_MEMORY_UTILIZATION, HEADLESS_GPU_MEMORY_UTILIZATION, add_device_args
from engine.config import DEFAULT_MODEL

DTYPE_HELP = ("auto: bf16 weights, computed in bf16 where the CPU has native bf16 dot products (avx512_bf16, "
              "AMX, Arm bf16), else prefill in fp32 (the engine line says which and why)")
THREADS_HELP = ("CPU threads (default: the cores other processes leave free, measured over half a second and "
                "followed while the engine runs)")


def _compute_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"], help=DTYPE_HELP)
    p.add_argument("--threads", type=int, default=None, help=THREADS_HELP)


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help="built-in name, Hugging Face folder, .gguf file or Hub id")
    add_device_args(p, HEADLESS_GPU_MEMORY_UTILIZATION)
    _compute_args(p)


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT such as 1280x720, got {text!r}") from None
    if not (320 <= w <= 8192 and 240 <= h <= 8192):
        raise argparse.ArgumentTypeError(f"{w}x{h}: expected 320-8192 x 240-8192 pixels")
    return w, h


def _epilog() -> str:
    from app.gui.keys import keys_help
    from app.talk.presets import PRESETS_DIR, available

    names = available(PRESETS_DIR)
    listed = textwrap.fill(", ".join(names), width=100, initial_indent="  ", subsequent_indent="  ")
    return (f"presets (--preset NAME, PgDown / PgUp in the app):\n{listed}\n\n"
            f"keys in the app:\n{keys_help()}\n\n"
            "subcommands have their own --help, e.g. `inferlab bench --help`.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferlab", description=__doc__, epilog=_epilog(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true",
                        help="print inferlab's version, torch's, the CPU and the native kernels' ISA tier, and exit")
    parser.add_argument("--preset", help="open with a preset (a name under presets/ or a .toml path)")
    parser.add_argument("--screenshot", metavar="OUT.png", help="run headless and save the window")
    parser.add_argument("--run-seconds", type=float, default=5.0)
    parser.add_argument("--report", metavar="OUT.json", default=None,
                        help="with --screenshot: sample the queue, goodput and latency every 5 s of the run and "
                             "write them with a verdict (does the preset keep up with its arrivals?)")
    parser.add_argument("--size", type=_size, default=None, metavar="WxH",
                        help="the window's size for --screenshot (default 1600x1000), e.g. 1280x720 for a projector")
    parser.add_argument("--presenter", action="store_true",
                        help="open in presenter mode (F11): only the preset's panels, large enough for a room")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="the app's model: built-in name, Hugging Face folder, .gguf file or Hub id")
    parser.add_argument("--attach", metavar="URL", default=None,
                        help="watch and load-test an OpenAI-compatible server (vLLM, SGLang, llama.cpp's "
                             "llama-server, inferlab serve) instead of the embedded engine, e.g. http://host:8000")
    parser.add_argument("--api-key", default=None, help="with --attach: the server's API key (Bearer)")
    from app.host.managed_args import add_manage_args

    add_manage_args(parser)
    add_device_args(parser, APP_GPU_MEMORY_UTILIZATION)
    _compute_args(parser)
    sub = parser.add_subparsers(dest="command")

    gen = sub.add_parser("generate", help="generate text, streamed to stdout")
    _engine_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--chat", action="store_true",
                     help="require the model's chat template (the default where the model has one)")
    gen.add_argument("--raw", action="store_true", help="send the prompt as it is, without the chat template")
    gen.add_argument("--stats", action="store_true", help="print timings to stderr at the end")

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1, /metrics)")
    from app.server.serve import add_serve_args

    add_serve_args(serve, _engine_args)

    train = sub.add_parser("train-mtp", help="train multi-token prediction heads on the model's own text")
    from app.train_mtp import add_train_mtp_args

    add_train_mtp_args(train, _engine_args)

    prepare = sub.add_parser("prepare", help="run every preset's measured comparison ahead of a talk; store them")
    from app.talk.compare.prepare import add_prepare_args

    add_prepare_args(prepare, _engine_args)

    train_lora = sub.add_parser("train-lora", help="train a small LoRA adapter (a style rewrite) on the CPU")
    from app.train_lora import add_train_lora_args

    add_train_lora_args(train_lora, _engine_args)

    tune = sub.add_parser("tune", help="start a real server (llama-server, vLLM, SGLang, inferlab) per configuration "
                                       "point, measure speed, cost, memory and quality; frontier as JSON/CSV/PNG")
    from app.tradeoff.managed.tune_cli import add_tune_args

    add_tune_args(tune)

    bench = sub.add_parser("bench", help="benchmarks; results as JSON")
    from app.bench.cli import add_bench_args

    add_bench_args(bench, _engine_args)
    return parser


def version_text() -> str:
    """inferlab's version, torch's, the CPU and the native kernels' tier (nothing is built or loaded)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import engine.kernels as kernels

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return (f"inferlab {ver('inferlab')} (torch {ver('torch')}, Python {platform.python_version()})\n"
            f"CPU: {platform.machine()}; native kernels: {kernels.describe_tier()} of "
            f"{', '.join(kernels.supported_tiers())}")


def main(argv: list[str] | None = None) -> int:
    """Every command; Ctrl+C ends it with one line and exit status 130 (the shell's for SIGINT), not a
    traceback from wherever the step was."""
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"\ninferlab: {args.command or 'inferlab'} interrupted", file=sys.stderr)
        return 130


def _run(args) -> int:
    if args.version:
        print(version_text())
        return 0
    if args.command == "generate":
        from app.generate import run_generate

        return run_generate(args)
    if args.command == "serve":
        from app.server.serve import run_serve

        return run_serve(args)
    if args.command == "train-mtp":
        from app.train_mtp import run_train_mtp

        return run_train_mtp(args)
    if args.command == "prepare":
        from app.talk.compare.prepare import run_prepare

        return run_prepare(args)
    if args.command == "train-lora":
        from app.train_lora import run_train_lora

        return run_train_lora(args)
    if args.command == "tune":
        from app.tradeoff.managed.tune_cli import run_tune_cli

        return run_tune_cli(args)
    if args.command == "bench":
        from app.bench.cli import run_bench

        return run_bench(args)
    from app.gui.launch import run_gui

    return run_gui(args)


if __name__ == "__main__":
    sys.exit(main())
