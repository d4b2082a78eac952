"""SGLang's flag table: `python -m sglang.launch_server --model-path CHECKPOINT ...` at one tuning point.

Every spelling below was read from SGLang 0.5.23 (the PyPI wheel sglang-0.5.23). That release declares
its flags as annotated dataclass fields under python/sglang/srt/arg_groups/fields/ and derives each flag
from the field's name (`arg_utils._field_to_cli_name`: `--` + name with `-` for `_`), with argparse
`choices` where a field lists them; python/sglang/srt/server_args.py registers them. The file each comes
from is named on its row. SGLang cannot run on this project's CPUs, so the table is tested against a
stand-in that parses the same flags (tests/standin_server.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from app.managed.hf_flags import EngineChoices, checkpoint_and_flags, draft_length
from app.managed.table import FlagRow, ServedModel, ServerPoint

SGLANG_SOURCE = ("SGLang 0.5.23 (PyPI wheel): python/sglang/srt/server_args.py, "
                 "python/sglang/srt/arg_groups/{fields/*.py,choices.py,speculative_hook.py}, "
                 "python/sglang/launch_server.py, python/sglang/srt/entrypoints/http_server.py")

# arg_groups/fields/model.py `kv_cache_dtype` Arg(choices=...): argparse refuses any other value.
SGLANG_KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
# arg_groups/choices.py QUANTIZATION_CHOICES, the `choices` of fields/model.py `quantization`.
SGLANG_QUANTIZATION_METHODS = (
    "awq", "fp8", "mxfp8", "gptq", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt",
    "modelopt_fp8", "modelopt_fp4", "nvfp4_online", "modelopt_mixed", "petit_nvfp4", "w8a8_int8", "w8a8_fp8",
    "moe_wna16", "w4afp8", "mxfp4", "auto-round", "auto-round-int8", "compressed-tensors", "modelslim",
    "mxfp_w4a8", "quark", "quark_int4fp8_moe", "quark_mxfp4", "mlx_q4", "mlx_q8", "unquant", "humming",
)
# The app's neutral KV names where SGLang spells them otherwise: SGLang has no bare "fp8"; vLLM's "fp8"
# means e4m3, so the same knob value gets the same format on both.
SGLANG_KV_ALIASES = {"fp8": "fp8_e4m3"}

SGLANG_CHOICES = EngineChoices("--max-running-requests", SGLANG_QUANTIZATION_METHODS, SGLANG_KV_CACHE_DTYPES,
                               SGLANG_KV_ALIASES)

SGLANG_ROWS = (
    # launch_server.py (module entry); fields/model.py `model_path` (alias --model)
    FlagRow("launch", "python -m sglang.launch_server --model-path CHECKPOINT",
            "the checkpoint of the point's weight format"),
    # fields/schedule.py `max_running_requests`
    FlagRow("batch", "--max-running-requests N", "requests running at once"),
    # fields/model.py `quantization` (choices.py QUANTIZATION_CHOICES; "fp8" = online MoE + linear)
    FlagRow("weight_format", "CHECKPOINT per format, else --quantization fp8",
            "a checkpoint per format (by_format: bf16, awq, gptq, ...); fp8 without one: the bf16 checkpoint "
            "quantized at load"),
    # fields/model.py `kv_cache_dtype`
    FlagRow("kv_dtype", "--kv-cache-dtype DTYPE", "KV cache element type: " + ", ".join(SGLANG_KV_CACHE_DTYPES)),
    # fields/spec.py speculative_algorithm (STANDALONE: a separate small draft model),
    # speculative_draft_model_path, speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens;
    # speculative_hook.py: with topk 1, num_draft_tokens is forced to num_steps + 1
    # speculative_hook.py _handle_ngram: NGRAM needs no draft model; topk = --speculative-ngram-max-bfs-breadth
    FlagRow("draft", "--speculative-algorithm STANDALONE --speculative-draft-model-path DRAFT "
            "--speculative-num-steps N --speculative-eagle-topk 1 --speculative-num-draft-tokens N+1",
            "a draft model proposing N tokens per step (one chain: top-k 1); without one, "
            "--speculative-algorithm NGRAM --speculative-num-draft-tokens N+1 (prompt lookup)"),
    # fields/schedule.py `chunked_prefill_size`: "-1 means disabling chunked prefill"; unset, memory_hook.py
    # picks a size by GPU memory (2048-8192), so "on" leaves it to SGLang
    FlagRow("chunked_prefill", "--chunked-prefill-size -1 (off)", "split long prompts (SGLang's default: on)"),
    # fields/memory.py `disable_radix_cache` (store_true)
    FlagRow("prefix_caching", "--disable-radix-cache (off)", "RadixAttention prefix reuse (SGLang's default: on)"),
    # fields/serving.py `host` (127.0.0.1), `port` (30000)
    FlagRow("host/port", "--host 127.0.0.1 --port PORT", "where the OpenAI API listens"),
    # fields/serving.py `served_model_name`
    FlagRow("name", "--served-model-name NAME", "the model name requests carry"),
    # entrypoints/http_server.py @app.get("/health")
    FlagRow("health", "GET /health", "200 once the model is loaded"),
)


@dataclass(frozen=True, slots=True)
class SglangEngine:
    """SGLang's server, run as a module of `exe` (the Python that has sglang installed). A format without its
    own checkpoint is quantized at load by its row's `--quantization` method (app/managed/formats.py)."""
    extra: tuple[str, ...] = ()  # appended to every command line (`inferlab tune --server-args`)
    name: str = "sglang"
    executable: str = "python"
    source: str = SGLANG_SOURCE
    rows: tuple[FlagRow, ...] = SGLANG_ROWS
    health_path: str = "/health"

    def point_flags(self, model: ServedModel, point: ServerPoint) -> list[str]:
        """The checkpoint and the flags that carry the point's knobs (no host or port)."""
        checkpoint, flags = checkpoint_and_flags(self.name, SGLANG_CHOICES, model, point)
        flags = ["--model-path", checkpoint, *flags]
        if draft_length(self.name, point.draft) and model.draft:
            flags += ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", model.draft,
                      "--speculative-num-steps", str(point.draft), "--speculative-eagle-topk", "1",
                      "--speculative-num-draft-tokens", str(point.draft + 1)]
        elif point.draft:  # n-gram lookup; its draft tokens count the root too, as STANDALONE's do
            flags += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(point.draft + 1)]
        if point.chunked_prefill is False:
            flags += ["--chunked-prefill-size", "-1"]
        if point.prefix_caching is False:
            flags += ["--disable-radix-cache"]
        return flags

    def argv(self, exe: str, model: ServedModel, point: ServerPoint, port: int,
             threads: int | None = None) -> list[str]:
        """`threads` is ignored: SGLang runs on a GPU and sizes its own CPU threads."""
        return [exe, "-m", "sglang.launch_server", *self.point_flags(model, point),
                "--host", "127.0.0.1", "--port", str(port), *self.extra]
