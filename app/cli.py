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
    from app.talk.presets import PRESETS_DIR
    from app.talk.talk_order import load_talk_or_files

    said: list[str] = []  # a talk.toml that lies: said under the list, which is then in file-name order
    names = load_talk_or_files(PRESETS_DIR, said.append).names
    listed = textwrap.fill(", ".join(names), width=100, initial_indent="  ", subsequent_indent="  ",
                           break_on_hyphens=False)
    listed += "".join(f"\n  ({line})" for line in said)
    return (f"presets in the talk's order (presets/talk.toml; --preset NAME, PgDown / PgUp in the app):\n{listed}\n\n"
            f"keys in the app:\n{keys_help()}\n\n"
            "subcommands have their own --help, e.g. `inferlab bench --help`.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferlab", description=__doc__, epilog=_epilog(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true",
                        help="print inferlab's version, torch's, the CPU and the native kernels' ISA tier, and exit")
    parser.add_argument("--preset", help="open with a preset (a name under presets/ or a .toml path)")
    parser.add_argument("--screenshot", metavar="OUT.png", help="run headless and save the window")
    parser.add_argument("--run-seconds", type=float, default=5.0,
                        help="with --screenshot: how long the preset runs before the window is saved")
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
    parser.add_argument("--replay", metavar="FILE", default=None,
                        help="play a recording (.inferlab-run, from --record, File → Record or prepare) in the "
                             "panels instead of running an engine: 1x/2x/4x, a scrubber, jumps to knob changes")
    parser.add_argument("--speed", type=float, choices=(1.0, 2.0, 4.0), default=1.0,
                        help="with --replay: the pace, in times the recorded one")
    from app.record.args import add_record_args

    add_record_args(parser, "what the app's panels show")
    parser.add_argument("--profile", default=None, metavar="NAME",
                        help="show the measured comparisons `inferlab prepare --profile NAME` stored (default: "
                             "$INFERLAB_PROFILE, else the shared store)")
    from app.managed.args import add_manage_args

    add_manage_args(parser)
    add_device_args(parser, APP_GPU_MEMORY_UTILIZATION)
    _compute_args(parser)
    sub = parser.add_subparsers(dest="command")

    gen = sub.add_parser("generate", help="generate text, streamed to stdout")
    from app.generate_args import add_generate_args

    add_generate_args(gen, _engine_args)

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
    from app.tradeoff.tune_cli import add_tune_args

    add_tune_args(tune)

    bench = sub.add_parser("bench", help="benchmarks; results as JSON")
    from app.bench.cli import add_bench_args

    add_bench_args(bench, _engine_args)
    show_defaults(parser)
    return parser


def _default_text(value) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value) or "none"
    return str(value)


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option's --help says its default, in every subcommand: "(default: X)" appended where the
    help does not already say it in words (a default of None is described there, or there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases share one parser
                show_defaults(sub)
            continue
        value = action.default
        if not action.option_strings or action.help == argparse.SUPPRESS or value in (None, argparse.SUPPRESS):
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._VersionAction)):
            continue  # a switch: its default is "not given"
        if value == [] and isinstance(action, argparse._AppendAction):
            continue  # repeatable: none unless given
        help_text = action.help or ""
        if "default" in help_text.lower():
            continue
        shown = _default_text(value).replace("%", "%%")
        action.help = f"{help_text} (default: {shown})".lstrip()


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
        from app.tradeoff.tune_cli import run_tune_cli

        return run_tune_cli(args, draw_png=_tune_png)
    if args.command == "bench":
        from app.bench.cli import run_bench

        return run_bench(args)
    from app.gui.launch import run_gui

    return run_gui(args)


def _tune_png(result: dict, path: str) -> bool:
    """`tune --png`: drawn by the tradeoff panel, so Qt is imported only when a PNG is asked for."""
    from app.gui.tune_png import write_png

    return write_png(result, path)


if __name__ == "__main__":
    sys.exit(main())
