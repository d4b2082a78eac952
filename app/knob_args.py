"""The engine knobs the tradeoff sweep varies, as `inferlab serve` / `generate` flags, and back: a measured point
becomes the command line that deploys it (`serve_command`), and that line's flags become the same
EngineConfig fields (`knob_settings`), checked with one clear error for a bad combination."""
from __future__ import annotations

import argparse
import shlex

from engine.events import KvCacheDtype, SpecMethod
from engine.knobs import KNOB
from engine.quant_formats import QUANT_FORMATS, quant_format
from engine.spec.draft_length import MAX_DRAFT

SPEC_METHODS = tuple(SpecMethod)
# weights per scale of 8- and 4-bit weights: the explorer's sweep quantizes in groups of 64 (not the engine's
# 32, the grid of the built-in model's Q4_1 file, where requantizing measures none of 4 bits' loss), so
# `serve` and `generate` take 64 too: the command a measured point gives serves what was measured
GROUP_SIZE = 64
DEFAULT_DRAFT_TOKENS = 4  # --spec-method without --num-draft-tokens
MAX_DRAFT_TOKENS = MAX_DRAFT  # the speculative decoder's limit (engine/spec/draft_length.py: no torch)


def _quantized_bits() -> str:
    """"8 or 4": the quantized formats' bits (engine/quant_formats.py), for help and errors."""
    return " or ".join(str(f.bits) for f in QUANT_FORMATS if f.quantized)


def add_knob_args(p: argparse.ArgumentParser) -> None:
    quantized = _quantized_bits()
    p.add_argument("--quant-bits", "--quant", type=int, default=16, choices=KNOB["quant_bits"].choices,
                   help=f"weight bits: {quantized} quantize the weights (weight-only) as the app's slider does")
    p.add_argument("--quant-group-size", type=int, default=None, choices=KNOB["quant_group_size"].choices,
                   help=f"weights per scale for --quant-bits {quantized} (default: {GROUP_SIZE}, as the explorer's "
                        "sweep measured)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KNOB["kv_cache_dtype"].choices,
                   help="int8 stores the KV cache in 8 bits (twice the tokens in the same memory)")
    p.add_argument("--spec-method", default=None, choices=SPEC_METHODS,
                   help="speculative decoding: n-gram lookup, a draft model (--draft-model) or MTP heads")
    p.add_argument("--num-draft-tokens", type=int, default=None, metavar="K",
                   help=f"tokens proposed per step with --spec-method (1-{MAX_DRAFT_TOKENS}, "
                        f"default {DEFAULT_DRAFT_TOKENS})")
    p.add_argument("--draft-model", default=None, help="with --spec-method draft: the draft model")


def knob_settings(args: argparse.Namespace) -> dict:
    """EngineConfig fields from the knob flags; ValueError names the flag that does not fit."""
    out = {"quant_bits": args.quant_bits, "kv_cache_dtype": args.kv_cache_dtype}
    if args.quant_group_size is not None and quant_format(args.quant_bits).dense:
        raise ValueError(f"--quant-group-size needs --quant-bits {_quantized_bits()} (16-bit weights have no "
                         "scales)")
    if not quant_format(args.quant_bits).dense:
        out["quant_group_size"] = args.quant_group_size or GROUP_SIZE
    k = args.num_draft_tokens
    if args.spec_method is None:
        if k:
            raise ValueError("--num-draft-tokens needs --spec-method (ngram, draft or mtp)")
        if args.draft_model:
            raise ValueError("--draft-model needs --spec-method draft")
        return out
    k = DEFAULT_DRAFT_TOKENS if k is None else k
    if not 1 <= k <= MAX_DRAFT_TOKENS:
        raise ValueError(f"--num-draft-tokens must be 1-{MAX_DRAFT_TOKENS}, got {k}")
    if args.spec_method == SpecMethod.DRAFT and not args.draft_model:
        raise ValueError("--spec-method draft needs --draft-model")
    if args.draft_model and args.spec_method != SpecMethod.DRAFT:
        raise ValueError(f"--draft-model is for --spec-method draft, not {args.spec_method}")
    out.update(spec_method=args.spec_method, num_speculative_tokens=k)
    if args.draft_model:
        out["draft_model"] = args.draft_model
    return out


def serve_command(config: dict, model: str) -> str:
    """The `inferlab serve` line for a point's engine settings (the tradeoff panel's config dict:
    max_num_seqs, quant_bits, quant_group_size, num_speculative_tokens, kv_cache_dtype, spec_method)."""
    argv = ["inferlab", "serve", "--model", model]
    if "max_num_seqs" in config:
        argv += ["--max-num-seqs", str(config["max_num_seqs"])]
    bits = int(config.get("quant_bits", 16))
    if bits != 16:
        argv += ["--quant-bits", str(bits)]
        if config.get("quant_group_size"):
            argv += ["--quant-group-size", str(config["quant_group_size"])]
    if config.get("kv_cache_dtype", KvCacheDtype.AUTO) != KvCacheDtype.AUTO:
        argv += ["--kv-cache-dtype", str(config["kv_cache_dtype"])]
    k = int(config.get("num_speculative_tokens") or 0)
    if k:
        argv += ["--spec-method", str(config.get("spec_method") or SpecMethod.NGRAM), "--num-draft-tokens", str(k)]
    return shlex.join(argv)
