"""Managed servers, a source beside remote/: the engine people deploy (llama.cpp's llama-server, vLLM,
SGLang, or `inferlab serve`), started and stopped by inferlab, once per configuration point of a tuning
sweep (app/tradeoff/tune.py: `inferlab tune`, File -> Tune a server...) or restarted by the app's sliders
(`inferlab --manage ENGINE`).

- `table.py`: the engine-neutral point (`ServerPoint`) and the shape of one engine's flag table
  (`ServerEngine`, `FlagRow`); each engine's table lives in its own module beside it.
- `child.py`: `ChildServer`, any HTTP server as a child process (also the benches' peers).
- `server.py`: `ManagedServer`, one engine's server process at one point, restartable; `PointFailed`
  carries the log tail of a point that would not start; `watchdog.py`: stops it at a cancel or a time limit.
- `llama_server.py`, `inferlab_serve.py`, `vllm.py`, `sglang.py`: those engines' flag tables (vLLM's and
  SGLang's share `hf_flags.py`: checkpoint per bit width or online quantization, choices read from their
  sources); `engines.py`: `ENGINES`, name -> table; `describe.py`: a table as Markdown (`--show-flags`).
- `gguf.py`: llama.cpp's binaries, the bf16 GGUF of the engine's weights and its Q8_0 / Q4_1 variants;
  `setup.py`: the server's executable and what it loads per bit width, found before it starts.
- `source.py`: `ManagedSource`, the attach source (app/remote/source.py) on a server it restarts when a
  slider moves; `knobs.py`: which sliders restart it and what changes; `args.py`: `--manage`'s options.
"""
