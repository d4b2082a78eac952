"""The tuning sweep on a real server (`inferlab tune`): one managed server per configuration point.

For each point: `ManagedServer.start` (a point that will not start is a failed point with the reason and
the server's log tail; the sweep goes on), a warm-up request, then the explorer's measurements through
HTTP: the seeded load generator at each rate (streaming /v1/completions, temperature 0, ignore_eos;
latencies from each request's due time), the server process's memory, its own /metrics, and greedy
agreement with the 16-bit point of the same model on held-out prompts. A server that dies mid-measurement
is a failed point too. Frontier, CSV and PNG as the explorer's (issue 13).

Public entry: `run_tune(spec: TuneSpec, progress=None, on_point=None, cancelled=None) -> dict`.

The result (plain JSON; `inferlab tune --json OUT` writes it):

    {
      "engine": "llama-server",              # ENGINES name
      "engine_source": "common/arg.cpp ...",  # where the flags' spelling was read, with the version
      "executable": "/path/to/llama-server",
      "model": {"name": str, "by_bits": {"16": path, "8": path, "4": path}, "draft": path | None,
                "draft_note": "the Q4_1 GGUF of the same model (same vocabulary)"},
      "flag_table": [{"knob": "batch", "flag": "-np", "meaning": "..."}, ...],
      "points": [                            # measured points, in sweep order
        {"engine", "model", "label",          # label: "batch 4, 8-bit, draft 4" (ServerPoint.label)
         "batch", "bits", "kv_dtype", "draft", "chunked_prefill", "prefix_caching",
         "flags": "-np 4 -c 2048 ...",        # the point's own flags (no host/port/threads)
         "command": "llama-server -m ...",    # shlex.join of the exact command line that ran
         "tokens_per_s_user",                 # 1 / p50 TPOT at the highest rate
         "tokens_per_s_total",                # output tokens / run wall time at the highest rate
         "usd_per_mtok",                      # price_per_hour / (tokens_per_s_total * 3600) * 1e6
         "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "goodput_rps", "slo_attainment",
         "runs": [row per rate: rate_rps, goodput_rps, slo_attainment, p50/p99 ttft/tpot (s),
                  output_tokens_per_s, duration_s, errors, load_1m],
         "memory": {"rss_bytes": int | None,  # VmRSS of the server process (/proc/PID/status), measured
                    "rss_peak_bytes": int | None,   # VmHWM
                    "server_metrics": {family: value}},  # what the server's own /metrics says
         "agreement": float | None,           # greedy agreement with the 16-bit point (see "quality")
         "agreement_positions": int,
         "kl": None, "ppl_delta_pct": None,   # only where the server returns prompt logprobs
         "on_frontier": bool, "predicted": false, "failed": false, "seconds": float}
      ],
      "failed": [{"engine", "model", "label", "batch", "bits", "kv_dtype", "draft", "chunked_prefill",
                  "prefix_caching", "flags", "command", "failed": true, "stage": "start" | "measure",
                  "reason": str, "log_tail": str, "seconds": float}],
      "frontier": [{"batch", "bits", "draft", "kv_dtype", "label"}],          # speed per user vs cost
      "frontier_with_quality": [...],                                         # ... and agreement
      "chosen": {"label", "command", "why"} | None,
      "quality": {"method": str, "reference": label | None, "prompts": int, "max_tokens": int,
                  "perplexity_kl": str},     # e.g. "not returned by llama-server"
      "workload": {...}, "slo": {"ttft_s", "tpot_s", "percentile"}, "price_per_hour": float,
      "measured_at": iso time, "wall_seconds": float, "stopped_early": str | None
    }
"""
from __future__ import annotations
