"""Managed servers: the engine people deploy (llama.cpp's llama-server, vLLM, SGLang, or `inferlab serve`),
started by inferlab once per configuration point, measured with the explorer's own load and quality
checks, and stopped (`inferlab tune`, File -> Tune a server...).

- `table.py`: the engine-neutral point (`ServerPoint`) and the shape of one engine's flag table
  (`ServerEngine`, `FlagRow`); each engine's table lives in its own module beside it.
- `child.py`: `ChildServer`, any HTTP server as a child process (also the benches' peers).
- `server.py`: `ManagedServer`, one engine's server process at one point, restartable; `PointFailed`
  carries the log tail of a point that would not start.
- `llama_server.py`, `inferlab_serve.py`, `vllm.py`, `sglang.py`: those engines' flag tables (vLLM's and
  SGLang's share `hf_flags.py`: checkpoint per bit width or online quantization, choices read from their
  sources); `engines.py`: `ENGINES`, name -> table; `describe.py`: a table as Markdown (`--show-flags`).
- `gguf.py`: llama.cpp's binaries, the bf16 GGUF of the engine's weights and its Q8_0 / Q4_1 variants.
- `tune.py`: the sweep (`run_tune`, the result's JSON shape at its top); `tune_measure.py`: what it measures
  on one server; `watchdog.py`: stops a point's server at a cancel or its time limit; `tune_export.py`: CSV
  and PNG; `tune_cli.py`: `inferlab tune`.
"""
