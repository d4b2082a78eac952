"""`inferlab serve`'s flag table: the explorer's knobs as this project's own server spells them.

Read from app/server/serve.py (add_serve_args) and app/knob_args.py (add_knob_args), the flags
the tradeoff panel's "copy as command" writes too.

- batch: `--max-num-seqs N`.
- weight bits: `--quant-bits 16|8|4` on the same weights (the engine quantizes them as it loads); a
  ServedModel may also map a bit width to other weights.
- KV cache dtype: `--kv-cache-dtype auto|int8`.
- draft: `--spec-method draft --draft-model D --num-draft-tokens N` when the ServedModel has a draft
  model, else n-gram lookup (`--spec-method ngram`), as the explorer's sweep drafts.
- chunked prefill: on by default; `--no-chunked-prefill` turns it off.
- prefix caching: on, and `inferlab serve` has no flag to turn it off (a FlagError says so).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from app.managed.table import FlagError, FlagRow, ServedModel, ServerPoint
from engine.events import KvCacheDtype
from engine.quant_formats import QUANT_BITS

# app/knob_args.py's --kv-cache-dtype choices (kept here: this table spells the server's flags as it read them);
# a draft length out of its range is refused by `inferlab serve` itself (a failed point with its message)
KV_DTYPES = tuple(KvCacheDtype)

ROWS = (
    FlagRow("batch", "--max-num-seqs N", "requests running at once"),
    FlagRow("bits", "--quant-bits 16|8|4", "weight-only quantization at load"),
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
        if point.bits not in QUANT_BITS:  # the engine's registry (engine/quant_formats.py)
            raise FlagError(f"--quant-bits takes {', '.join(map(str, QUANT_BITS))}, not {point.bits}")
        weights = model.weights(point.bits if point.bits in model.by_bits else 16)
        flags = ["--model", weights, "--max-num-seqs", str(point.batch)]
        if point.bits != 16 and weights == model.by_bits.get(16):
            flags += ["--quant-bits", str(point.bits)]
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
