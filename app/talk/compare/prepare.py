"""`inferlab prepare [--json OUT] [--preset NAME ...]`: run every preset's comparison ahead of a talk,
with progress on stderr, and store the results per machine, model and configuration (app/talk/compare/store.py).
Each result is checked against its chapter's claims (app/talk/compare/prepare_chapter.py): a contradiction
is flagged with its likely reason, and a preset's fallback is tried once. A preset whose comparison fails
is reported and skipped; the others still run and are stored."""
from __future__ import annotations

import json
import sys
import time

from app.result_file import write_or_print
from app.talk.compare.headline import headline_text
from app.talk.compare.job import comparison_base
from app.talk.compare.machine import machine_info
from app.talk.compare.prepare_chapter import check_lines, dtype_conditions, run_checked
from app.talk.compare.profile import active_profile, record_prepare, use_profile
from app.talk.compare.runner import run_comparison
from app.talk.compare.store import prepared_json, save_result
from app.talk.compare.warm_compile import compiled_configs, spare_cores, start


def add_prepare_args(p, engine_args) -> None:
    engine_args(p)
    p.add_argument("--json", metavar="OUT", help="also write every result to one JSON file")
    p.add_argument("--preset", action="append", default=[], metavar="NAME",
                   help="only this preset (repeatable); default: every preset, in the talk's order (presets/talk.toml)")
    p.add_argument("--profile", default=None, metavar="NAME",
                   help="store the results in profile NAME (the app's --profile shows them; default: the shared "
                        "store), so another prepare on this machine does not overwrite a speaker's")
    p.add_argument("--no-background-compile", dest="background_compile", action="store_false",
                   help="compile the torch.compile configurations in their chapter, not ahead on a spare core")


def _say(text: str, fraction: float | None = None) -> None:
    line = f"{text}  {100 * fraction:5.1f}%" if fraction is not None else text
    print(line, file=sys.stderr, flush=True)


def run_prepare(args) -> int:
    import torch

    from app.device_args import engine_threads
    from app.result_file import unwritable
    from app.talk.presets import PresetError, available, load_preset
    from engine.core.metrics import SLO
    from engine.loading.loader import load_model

    # the app's thread count by default: results are stored per machine and thread count, and the app
    # looks up its own (one core left to the GUI thread)
    args.threads = args.threads or engine_threads()
    torch.set_num_threads(args.threads)
    try:
        use_profile(getattr(args, "profile", None))
    except ValueError as exc:
        _say(f"error: --profile: {exc}")
        return 2
    bad = unwritable({"json": args.json})
    if bad:  # said before the chapters' minutes, not after them
        _say(f"error: {bad}")
        return 2
    try:
        presets = [load_preset(n) for n in args.preset or available()]  # available(): presets/talk.toml's order
    except PresetError as exc:
        _say(f"error: {exc}")
        return 2
    t_start = time.perf_counter()
    background = {}
    compiling = [p for p in presets if p.compare is not None and compiled_configs(p.compare)]
    if getattr(args, "background_compile", True) and spare_cores(args.threads) > 0 and len(compiling) < len(presets):
        # compiled configurations compile ahead on the core prepare leaves idle, while the other chapters run;
        # their own chapters run last
        for preset in compiling:
            background[preset.name] = start(preset.name, args.model, str(args.dtype), str(args.device), args.threads)
            _say(f"{preset.name}: compiling its torch.compile configuration ahead, on a spare core "
                 "(its chapter runs last; --no-background-compile: in its chapter)")
        presets = [p for p in presets if p.name not in background] + [p for p in presets if p.name in background]
    shown = [-1.0]

    def load_progress(text: str, fraction: float) -> None:
        if fraction - shown[0] >= 0.2 or fraction >= 1.0:
            shown[0] = fraction
            _say(f"loading {args.model}: {text}", fraction)

    try:
        loaded = load_model(args.model, progress=load_progress)
        base = comparison_base(args.model, args.dtype, args.device, args.threads)
        results, failed, written = {}, [], {}
        conditions = {**dtype_conditions(args.dtype, args.device), "threads": args.threads}
        for i, preset in enumerate(presets):
            if preset.compare is None:
                _say(f"[{i + 1}/{len(presets)}] {preset.name}: no [compare] section, skipped")
                continue
            t0 = time.perf_counter()

            def progress(text: str, fraction: float, i=i) -> None:
                _say(f"[{i + 1}/{len(presets)}] {text}", (i + fraction) / len(presets))

            def run(spec, preset=preset, progress=progress) -> dict:
                return run_comparison(spec, loaded, base, slo=SLO(preset.ttft_s, preset.tpot_s), progress=progress)

            chapter_conditions = conditions
            if preset.name in background:
                ok, took, tail = background.pop(preset.name).wait()
                note = (f"compile cache warmed by a compile ahead on a spare core ({took:.0f} s, during the other "
                        "chapters): warmup_s is a warm cache's" if ok else
                        f"the compile ahead failed ({tail or 'no output'}): this chapter compiled cold")
                _say(f"[{i + 1}/{len(presets)}] {preset.name}: {note}")
                chapter_conditions = {**conditions, "compile_ahead": note}
            try:
                result = run_checked(preset, run, chapter_conditions, _say)
            except Exception as exc:  # one broken comparison must not cost the others
                failed.append(preset.name)
                _say(f"[{i + 1}/{len(presets)}] {preset.name}: FAILED: {type(exc).__name__}: {exc}")
                continue
            path = save_result(preset.name, args.model, result)
            written[preset.name] = path
            results[preset.name] = result
            _say(f"[{i + 1}/{len(presets)}] {preset.name}: {headline_text(result)} "
                 f"({time.perf_counter() - t0:.1f} s; stored in {path})")
            for line in check_lines(result):
                _say(line)
    finally:
        for bg in background.values():  # a prepare that stopped early leaves no compile behind
            bg.proc.kill()
            bg.wait()
        if written:  # what this run wrote: the app names a result measured again since (profile.py)
            record_prepare(written, active_profile())
    flagged = [n for n, r in results.items() if any(v["holds"] is False for v in r.get("checks", []))]
    profile = active_profile()
    _say(f"prepared {len(results)} of {len(presets)} presets in {time.perf_counter() - t_start:.0f} s"
         + (f" (profile {profile}: `inferlab --profile {profile}` shows them)" if profile else "")
         + (f"; failed: {', '.join(failed)}" if failed else "")
         + (f"; CONTRADICT THEIR CHAPTER: {', '.join(flagged)} (see above)" if flagged else ""))
    if args.json:
        doc = prepared_json(args.model, machine_info(args.device), results)
        if not write_or_print(args.json, json.dumps(doc, indent=1), "inferlab prepare"):
            return 1  # the results are stored, and went to stdout
        _say(f"wrote {args.json}")
    return 1 if failed else 0
