"""vLLM's flag table: `vllm serve CHECKPOINT ...` at one tuning point.

Every spelling below was read from vLLM 0.33.0 (the PyPI wheel vllm-0.33.0, `vllm/_version.py` commit
g4ba787ec9); the file each comes from is named on its row. vLLM cannot run on this project's CPUs, so the
table is tested against a stand-in that parses the same flags (tests/standin_server.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from app.managed.hf_flags import EngineChoices, checkpoint_and_flags, draft_length
from app.managed.table import FlagRow, ServedModel, ServerPoint

VLLM_SOURCE = ("vLLM 0.33.0 (PyPI wheel, commit g4ba787ec9): vllm/engine/arg_utils.py, "
               "vllm/config/{cache,scheduler,speculative,model}.py, vllm/entrypoints/common/cli_args.py")

# vllm/config/cache.py `CacheDType` (KV_CACHE_DTYPES). arg_utils gives --kv-cache-dtype only a metavar
# (the field is `CacheDType | str`, so platform plugins can add more); CacheConfig._validate_cache_dtype
# refuses any other value with "Invalid kv_cache_dtype".
VLLM_KV_CACHE_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "octave_k3v4",
    "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
    "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)
# vllm/model_executor/layers/quantization/__init__.py `QuantizationMethods`; ModelConfig refuses any other
# with "Unknown quantization method" (again metavar-only on the command line).
VLLM_QUANTIZATION_METHODS = (
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8",
    "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
    "nvfp4_per_token", "mxfp8",
)
# The app's neutral KV names where vLLM spells them otherwise ("fp8" is vLLM's own: = fp8_e4m3).
VLLM_KV_ALIASES = {"f16": "float16", "bf16": "bfloat16"}

VLLM_CHOICES = EngineChoices("--max-num-seqs", VLLM_QUANTIZATION_METHODS, VLLM_KV_CACHE_DTYPES, VLLM_KV_ALIASES)

VLLM_ROWS = (
    # vllm/entrypoints/cli/serve.py: usage "vllm serve [model_tag] [options]" (positional model_tag)
    FlagRow("launch", "vllm serve CHECKPOINT", "the checkpoint of the point's weight format"),
    # arg_utils.py scheduler group; SchedulerConfig.max_num_seqs (Field ge=1)
    FlagRow("batch", "--max-num-seqs N", "sequences scheduled in one step"),
    # arg_utils.py model group "--quantization", "-q"; a quantized checkpoint carries its own method
    FlagRow("weight_format", "CHECKPOINT per format, else --quantization fp8",
            "a checkpoint per format (by_format: bf16, awq, gptq, ...); fp8 without one: the bf16 checkpoint "
            "quantized at load"),
    # arg_utils.py cache group; CacheConfig.cache_dtype
    FlagRow("kv_dtype", "--kv-cache-dtype DTYPE", "KV cache element type: " + ", ".join(VLLM_KV_CACHE_DTYPES)),
    # arg_utils.py vllm group "--speculative-config", "-sc" (JSON); config/speculative.py SpeculativeConfig
    # .method ("draft_model", "ngram"), .model, .num_speculative_tokens (Field gt=0); ngram's
    # prompt_lookup_min/max default to 5 when neither is given
    FlagRow("draft", '--speculative-config {"method":"draft_model","model":DRAFT,"num_speculative_tokens":N}',
            "a draft model proposing N tokens per step; without one, "
            '{"method":"ngram","num_speculative_tokens":N} (prompt lookup)'),
    # arg_utils.py scheduler group; a bool field gets argparse.BooleanOptionalAction, which 0.33's
    # FlexibleArgumentParser registers as utils/argparse_utils.py EnableDisableAction: --disable-x is the
    # spelling its help shows, --no-enable-x "still accepted for backwards compatibility". The table uses
    # --no-enable-x, which releases before EnableDisableAction take too.
    FlagRow("chunked_prefill", "--enable-chunked-prefill / --no-enable-chunked-prefill",
            "split long prompts across steps (vLLM's default: on; 0.33 also spells off --disable-chunked-prefill)"),
    # arg_utils.py cache group; the same EnableDisableAction
    FlagRow("prefix_caching", "--enable-prefix-caching / --no-enable-prefix-caching",
            "reuse KV blocks of a shared prompt prefix (vLLM's default: on; 0.33 also spells off "
            "--disable-prefix-caching)"),
    # entrypoints/common/cli_args.py FrontendArgs.host, .port (default 8000)
    FlagRow("host/port", "--host 127.0.0.1 --port PORT", "where the OpenAI API listens"),
    # arg_utils.py model group; ModelConfig.served_model_name
    FlagRow("name", "--served-model-name NAME", "the model name requests carry"),
    # entrypoints/serve/instrumentator/health.py: GET /health -> 200 once the engine answers
    FlagRow("health", "GET /health", "200 once the model is loaded"),
)


@dataclass(frozen=True, slots=True)
class VllmEngine:
    """vLLM's server. A format without its own checkpoint is quantized at load by its row's `--quantization`
    method (app/managed/formats.py; checked against `VLLM_QUANTIZATION_METHODS`)."""
    extra: tuple[str, ...] = ()  # appended to every command line (`inferlab tune --server-args`)
    name: str = "vllm"
    executable: str = "vllm"
    source: str = VLLM_SOURCE
    rows: tuple[FlagRow, ...] = VLLM_ROWS
    health_path: str = "/health"

    def point_flags(self, model: ServedModel, point: ServerPoint) -> list[str]:
        """The checkpoint and the flags that carry the point's knobs (no host or port)."""
        checkpoint, flags = checkpoint_and_flags(self.name, VLLM_CHOICES, model, point)
        flags = [checkpoint, *flags]
        if draft_length(self.name, point.draft):
            # A draft model when given; else n-gram prompt lookup (prompt_lookup_min/max default to 5).
            config = ({"method": "draft_model", "model": model.draft} if model.draft else {"method": "ngram"})
            config["num_speculative_tokens"] = point.draft
            flags += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
        return flags + _on_off("--enable-chunked-prefill", point.chunked_prefill) + _on_off(
            "--enable-prefix-caching", point.prefix_caching)

    def argv(self, exe: str, model: ServedModel, point: ServerPoint, port: int,
             threads: int | None = None) -> list[str]:
        """`threads` is ignored: vLLM runs on a GPU and sizes its own CPU threads."""
        return [exe, "serve", *self.point_flags(model, point), "--host", "127.0.0.1", "--port", str(port),
                *self.extra]


def _on_off(flag: str, value: bool | None) -> list[str]:
    """BooleanOptionalAction's two spellings (EnableDisableAction takes both); None leaves vLLM's default."""
    if value is None:
        return []
    return [flag] if value else ["--no-" + flag.removeprefix("--")]
