"""`inferlab serve`'s flag table: the explorer's knobs as this project's own server spells them.

Read from app/server/serve.py (add_serve_args) and app/knob_args.py (add_knob_args), the flags
the tradeoff panel's "copy as command" writes too.

- batch: `--max-num-seqs N`.
- weights: `--quant-format NAME` (engine/quant_formats.py: int8, fp8-e4m3, int4) on the bf16 weights (the
  engine quantizes them as it loads); a ServedModel may also map a format's name to other weights.
- KV cache dtype: `--kv-cache-dtype auto|int8`.
- draft: `--spec-method draft --draft-model D --num-draft-tokens N` when the ServedModel has a draft
  model, else n-gram lookup (`--spec-method ngram`), as the explorer's sweep drafts.
- chunked prefill: on by default; `--no-chunked-prefill` turns it off.
- prefix caching: on, and `inferlab serve` has no flag to turn it off (a FlagError says so).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from app.managed.formats import REFERENCE
from app.managed.table import FlagError, FlagRow, ServedModel, ServerPoint, served_format
from engine.events import KvCacheDtype
from engine.quant_formats import QUANT_FORMAT_NAMES

# app/knob_args.py's --kv-cache-dtype choices (kept here: this table spells the server's flags as it read them);
# a draft length out of its range is refused by `inferlab serve` itself (a failed point with its message)
KV_DTYPES = tuple(KvCacheDtype)

ROWS = (
    FlagRow("batch", "--max-num-seqs N", "requests running at once"),
    FlagRow("weight_format", "--quant-format " + "|".join(QUANT_FORMAT_NAMES), "weight-only quantization at load"),
    FlagRow("kv_dtype", "--kv-cache-dtype auto|int8", "int8 KV cache: twice the tokens in the same memory"),
    FlagRow("draft", "--spec-method draft|ngram --num-draft-tokens N [--draft-model D]",
            "speculative decoding, N tokens proposed per step"),
    FlagRow("chunked_prefill", "--no-chunked-prefill", "on by default; the flag prefills each prompt whole"),
    FlagRow("prefix_caching", "(no flag)", "always on"),
)


@dataclass(frozen=True, slots=True)
class InferlabServe:
    """`inferlab serve` run as `python -m app.cli serve` by default (the executable may also be the
    `inferlab` script: then the module part is left out)."""
    name: str = "inferlab"
    executable: str = sys.executable
    source: str = "inferlab: app/server/serve.py (add_serve_args), app/knob_args.py (add_knob_args)"
    rows: tuple[FlagRow, ...] = ROWS
    health_path: str = "/health"

    def point_flags(self, model: ServedModel, point: ServerPoint) -> list[str]:
        if point.batch < 1:
            raise FlagError(f"--max-num-seqs must be at least 1, got {point.batch}")
        fmt = served_format(self.name, point).name
        weights = model.weights(fmt if fmt in model.by_format else REFERENCE)
        flags = ["--model", weights, "--max-num-seqs", str(point.batch)]
        if fmt != REFERENCE and fmt not in model.by_format:  # the engine quantizes the bf16 weights as it loads
            flags += ["--quant-format", fmt]
        if point.kv_dtype is not None:
            if point.kv_dtype not in KV_DTYPES:
                raise FlagError(f"--kv-cache-dtype takes {', '.join(KV_DTYPES)}; not {point.kv_dtype!r}")
            flags += ["--kv-cache-dtype", point.kv_dtype]
        if point.draft:
            method = ["--spec-method", "draft", "--draft-model", model.draft] if model.draft else \
                ["--spec-method", "ngram"]
            flags += [*method, "--num-draft-tokens", str(point.draft)]
        if point.chunked_prefill is False:
            flags.append("--no-chunked-prefill")
        if point.prefix_caching is False:
            raise FlagError("inferlab serve has no flag to turn prefix caching off")
        return flags

    def argv(self, exe: str, model: ServedModel, point: ServerPoint, port: int,
             threads: int | None = None) -> list[str]:
        head = [exe, "-m", "app.cli", "serve"] if exe == sys.executable else [exe, "serve"]
        argv = [*head, *self.point_flags(model, point), "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "warning"]
        return argv + (["--threads", str(threads)] if threads is not None else [])
