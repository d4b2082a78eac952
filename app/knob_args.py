"""The knobs' command-line flags, generated from the knob table (engine/knobs.py: each row's `flag`, `help`,
type, choices and where it is offered), as vLLM generates its flags from its config: `inferlab serve` takes
every row offered to it (Use.SERVE), `generate` the ones it shares (Use.GENERATE). And back: a measured point
becomes the command line that deploys it (`serve_command`), and that line's flags become the same
EngineConfig fields (`knob_settings`), checked with one clear error naming the flag."""
from __future__ import annotations

import argparse
import shlex
from typing import Any

from engine.events import SpecMethod
from engine.knobs import Knob, KnobValues, Use, knobs_for
from engine.quant_formats import QUANT_FORMATS, quant_format
from engine.spec.draft_length import MAX_DRAFT

# weights per scale of a grouped format (int4): the explorer's sweep quantizes in groups of 64 (not the engine's
# 32, the grid of the built-in model's Q4_1 file, where requantizing measures none of int4's loss), so
# `serve` and `generate` take 64 too: the command a measured point gives serves what was measured
GROUP_SIZE = 64
DEFAULT_DRAFT_TOKENS = 4  # --spec-method without --num-draft-tokens
MAX_DRAFT_TOKENS = MAX_DRAFT  # the speculative decoder's limit (engine/spec/draft_length.py: no torch)
ALIASES = {"quant_format": ("--quant",)}  # shorter spellings kept beside a row's flag


def _grouped() -> str:
    return " or ".join(f.name for f in QUANT_FORMATS if f.grouped)


def add_flag(p: argparse.ArgumentParser, row: Knob, default: Any = None) -> None:
    """One knob's flag, from its row. A flag defaults to None (or `default`, a command's own): an unset flag
    leaves the engine's default (said in the help), so `knob_settings` passes on only what was given."""
    assert row.flag is not None
    shown = row.default if default is None else default
    said = "" if shown is None else f" (default: {row.text(shown)})"
    kw: dict[str, Any] = {"dest": row.name, "default": default, "help": (row.help or row.label) + said}
    if row.type is bool:
        kw["action"] = argparse.BooleanOptionalAction  # --compile / --no-compile
    elif row.choices:
        kw.update(choices=[str(getattr(c, "value", c)) for c in row.choices], type=str)
        if row.type is int:
            kw.update(choices=list(row.choices), type=int)
    else:
        kw.update(type=row.type, metavar=(row.unit or row.type.__name__).upper())
    p.add_argument(row.flag, *ALIASES.get(row.name, ()), **kw)


def add_knob_args(p: argparse.ArgumentParser, use: Use = Use.GENERATE, defaults: dict | None = None) -> None:
    """The flags of every knob offered at `use` (`defaults`: the command's own, where not the engine's), and
    --draft-model (a path, not a knob of the table)."""
    for row in knobs_for(use):
        if row.flag is not None:
            add_flag(p, row, (defaults or {}).get(row.name))
    p.add_argument("--draft-model", default=None, help="with --spec-method draft: the draft model")


def knob_settings(args: argparse.Namespace, use: Use = Use.GENERATE) -> dict:
    """EngineConfig fields from the knob flags given; ValueError names the flag that does not fit."""
    out: dict[str, Any] = {}
    for row in knobs_for(use):
        value = getattr(args, row.name, None)
        if row.flag is None or value is None:
            continue
        try:
            out[row.name] = row.check(value)
        except ValueError as exc:
            raise ValueError(f"{row.flag}: {str(exc).split(': ', 1)[-1]}") from None
    fmt = quant_format(out.get("quant_format", "bf16"))
    if "quant_group_size" in out and not fmt.grouped:
        raise ValueError(f"--quant-group-size needs --quant-format {_grouped()} ({fmt.name} has no groups)")
    if fmt.grouped:
        out.setdefault("quant_group_size", GROUP_SIZE)
    return out | _speculation(out, getattr(args, "draft_model", None))


def _speculation(out: dict, draft_model: str | None) -> dict:
    method, k = out.get("spec_method"), out.get("num_speculative_tokens")
    if method is None:
        if k:
            raise ValueError("--num-draft-tokens needs --spec-method (ngram, draft or mtp)")
        if draft_model:
            raise ValueError("--draft-model needs --spec-method draft")
        return {}
    k = DEFAULT_DRAFT_TOKENS if k is None else k
    if not 1 <= k <= MAX_DRAFT_TOKENS:
        raise ValueError(f"--num-draft-tokens must be 1-{MAX_DRAFT_TOKENS}, got {k}")
    if method == SpecMethod.DRAFT and not draft_model:
        raise ValueError("--spec-method draft needs --draft-model")
    if draft_model and method != SpecMethod.DRAFT:
        raise ValueError(f"--draft-model is for --spec-method draft, not {method}")
    return {"num_speculative_tokens": k, **({"draft_model": draft_model} if draft_model else {})}


def serve_command(config: KnobValues, model: str) -> str:
    """The `inferlab serve` line for a point's engine settings (knob name -> value: the tradeoff panel's
    config), each knob by its row's flag where it differs from the engine's default."""
    argv = ["inferlab", "serve", "--model", model]
    values: dict[str, Any] = dict(config)
    if values.get("num_speculative_tokens"):
        values.setdefault("spec_method", SpecMethod.NGRAM)
    grouped = quant_format(values.get("quant_format", "bf16")).grouped
    for row in knobs_for(Use.SERVE):
        value = values.get(row.name)
        keep = row.name == "quant_group_size" and grouped  # serve's own default for it is GROUP_SIZE, not 32
        if row.flag is None or row.name not in values or (value == row.default and not keep):
            continue
        if row.name == "quant_group_size" and not grouped:
            continue
        if row.type is bool:
            argv.append(row.flag if value else "--no-" + row.flag[2:])
        elif value is not None:
            argv += [row.flag, str(getattr(value, "value", value))]
    return shlex.join(argv)
