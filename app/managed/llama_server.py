"""llama.cpp's `llama-server` flag table: the explorer's knobs in its own spelling.

Every flag below was read from the llama.cpp source that scripts/build_llama_cpp.sh builds (the one in
llama-cpp-python 0.3.36's sdist: common/arg.cpp and tools/server/README.md). That version removed
`--draft-max`/`--draft-min` (arg.cpp: "the argument has been removed. use --spec-draft-n-max"); the
draft flags are the `--spec-draft-*` ones, with the draft type named (`--spec-type draft-simple`)
rather than guessed from the draft GGUF's metadata.

- batch: `-np N` slots, `-c` = N x the context per slot and `--no-kv-unified`, so every slot holds the
  longest request (as the benches run it: no request can run out of cache in a shared pool).
- weights: a GGUF per format, named by its file type (`-m`): bf16, f16, q8_0, q4_1, q4_k_m, q4_0
  (app/managed/formats.py; found or made by app/managed/gguf.py).
- KV cache dtype: `-ctk T -ctv T`, T one of arg.cpp's kv_cache_types.
- draft: `--spec-type draft-simple -md DRAFT.gguf --spec-draft-n-max N --spec-draft-n-min 0`.
- chunked prefill: llama-server has no switch for it. It always splits a prompt into `-b`-token batches
  and, with continuous batching (`-cb`, on by default), runs them in the same batches as other slots'
  decodes: True is that default (no flag), False is a FlagError.
- prefix caching: `--cache-prompt` / `--no-cache-prompt` (a slot reuses the prompt prefix it holds).
"""
from __future__ import annotations

from dataclasses import dataclass

from app.managed.formats import formats_for
from app.managed.table import FlagError, FlagRow, ServedModel, ServerPoint, served_format

LLAMA_CPP_SOURCE = "llama.cpp from llama-cpp-python 0.3.36's sdist: common/arg.cpp, tools/server/README.md"
# common/arg.cpp: kv_cache_types (the names ggml_type_name gives them)
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
DEFAULT_CTX_PER_SLOT = 2048

ROWS = (
    FlagRow("batch", "-np N, -c N x ctx-per-slot, --no-kv-unified", "server slots decoding at once; one KV "
            "region per slot"),
    FlagRow("weight_format", "-m MODEL.gguf",
            "a GGUF per format, by its file type: " + ", ".join(formats_for("llama-server"))),
    FlagRow("kv_dtype", "-ctk T -ctv T", "KV cache element type: " + ", ".join(KV_CACHE_TYPES)),
    FlagRow("draft", "--spec-type draft-simple -md DRAFT.gguf --spec-draft-n-max N --spec-draft-n-min 0",
            "draft model speculation, N tokens proposed per step"),
    FlagRow("chunked_prefill", "(no flag)", "always on: prompts go in -b-token batches beside other slots' "
            "decodes (continuous batching, -cb, the default)"),
    FlagRow("prefix_caching", "--cache-prompt / --no-cache-prompt", "reuse the prompt prefix a slot holds"),
)


@dataclass(frozen=True, slots=True)
class LlamaServer:
    """The `llama-server` table; `ctx_per_slot` is each slot's context (the sweep sizes it to its longest
    request); `extra` is appended to every command line (e.g. ("--no-repack",))."""
    ctx_per_slot: int = DEFAULT_CTX_PER_SLOT
    extra: tuple[str, ...] = ()
    name: str = "llama-server"
    executable: str = "llama-server"
    source: str = LLAMA_CPP_SOURCE
    rows: tuple[FlagRow, ...] = ROWS
    health_path: str = "/health"

    def point_flags(self, model: ServedModel, point: ServerPoint) -> list[str]:
        """The flags that carry the point's knobs (no host, port or threads)."""
        if point.batch < 1:
            raise FlagError(f"-np must be at least 1, got {point.batch}")
        flags = ["-m", model.weights(served_format(self.name, point).name), "-np", str(point.batch),
                 "-c", str(point.batch * self.ctx_per_slot), "--no-kv-unified"]
        if point.kv_dtype is not None:
            if point.kv_dtype not in KV_CACHE_TYPES:
                raise FlagError(f"llama-server's KV cache types are {', '.join(KV_CACHE_TYPES)}; "
                                f"not {point.kv_dtype!r}")
            flags += ["-ctk", point.kv_dtype, "-ctv", point.kv_dtype]
        if point.draft:
            if not model.draft:
                raise FlagError("a draft length needs a draft GGUF (-md); this model has none")
            flags += ["--spec-type", "draft-simple", "-md", model.draft, "--spec-draft-n-max", str(point.draft),
                      "--spec-draft-n-min", "0"]
        if point.chunked_prefill is False:
            raise FlagError("llama-server has no flag to turn chunked prefill off: it always splits prompts "
                            "into -b-token batches mixed with decodes (continuous batching)")
        if point.prefix_caching is not None:
            flags.append("--cache-prompt" if point.prefix_caching else "--no-cache-prompt")
        return flags

    def argv(self, exe: str, model: ServedModel, point: ServerPoint, port: int,
             threads: int | None = None) -> list[str]:
        argv = [exe, *self.point_flags(model, point), "--host", "127.0.0.1", "--port", str(port), "--metrics"]
        if threads is not None:
            argv += ["-t", str(threads), "-tb", str(threads)]
        return argv + list(self.extra)
