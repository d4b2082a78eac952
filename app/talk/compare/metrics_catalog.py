"""Every metric a comparison can report: its name says what and in what unit; the text says how it was
got. Names with "predicted" are model-based estimates and are shown as such; the rest are measured."""
from __future__ import annotations

from types import MappingProxyType

METRICS = MappingProxyType({
    "tokens_per_s": "output tokens / wall time of the run (first arrival to last finish)",
    "per_user_tokens_per_s": "median over requests of 1 / TPOT: the speed one user sees",
    "prefill_tokens_per_s": "prompt tokens / time of the steps that only prefilled",
    "decode_tokens_per_s": "output tokens / time of the steps that only decoded",
    "step_ms_median": "median wall time of one engine step",
    "decode_step_ms_median": "median wall time of a decode-only step",
    "p50_ttft_ms": "time to first token, median", "p99_ttft_ms": "time to first token, 99th percentile",
    "p50_e2e_ms": "arrival to last token, median", "p99_e2e_ms": "arrival to last token, 99th percentile",
    "p50_tpot_ms": "time per output token after the first, median",
    "p99_tpot_ms": "time per output token after the first, 99th percentile (a stream's worst stalls)",
    "p99_itl_ms": "time between two tokens of one answer, 99th percentile over every gap of every answer",
    "max_itl_ms": "longest time between two tokens of one answer: a stream frozen behind someone's prefill",
    "p50_first_text_ms": "arrival to the first text the user sees, median: the first token when streamed, the "
                         "whole answer when not",
    "p99_first_text_ms": "arrival to the first text the user sees, 99th percentile",
    "p50_queue_ms": "arrival to first scheduled, median", "p50_prefill_ms": "first scheduled to first token, median",
    "p50_decode_ms": "first token to finished, median",
    "goodput_rps": "requests per second that met the preset's latency budget",
    "slo_attainment_pct": "share of requests that met the latency budget, %",
    "weights_bytes": "bytes of the weights in memory (packed copies included)",
    "kv_blocks": "KV blocks the engine could allocate",
    "kv_blocks_peak": "KV blocks in use at the busiest step",
    "kv_bytes_peak": "KV bytes in use at the busiest step",
    "prefix_cache_saved_tokens": "prompt tokens not recomputed thanks to the prefix cache",
    "preemptions": "requests preempted (KV memory ran out)",
    "tokens_computed_per_output_token": "tokens run through the model per output token (work per token)",
    "bytes_per_decode_step": "weights (one copy) + the batch's KV read by one decode step, from the sizes",
    "achieved_gb_per_s": "bytes_per_decode_step / measured decode step time",
    "probe_gb_per_s": "memory bandwidth measured by a large tensor reduction on this machine",
    "predicted_decode_tokens_per_s": "predicted ceiling: tokens per step x probe bandwidth / bytes per step",
    "acceptance_rate_pct": "speculative drafts the target accepted, %",
    "tokens_per_verify": "tokens emitted per verification pass",
    "perplexity": "perplexity on held-out text (the first ~4000 characters of assets/heldout.txt)",
    "kl_divergence": "KL(16-bit || this) per token on held-out text",
    "greedy_agreement_pct": "held-out positions where the argmax matches the 16-bit model, %",
    "warmup_s": "wall time of the first, untimed run (includes any compiling)",
    "same_output_as_first_pct": "requests whose greedy token ids equal the first configuration's, % (in bf16 "
                                "another batch shape can flip a near tie, so below 100 is not by itself an error)",
    "held_back_chars_max": "most characters decoded but held back (partial UTF-8 or stop string)",
    "outputs_with_held_back": "streamed deltas that held characters back",
    "wall_s": "wall time of the timed run",
    "adapters_in_mix": "distinct LoRA adapters the requests named (round-robin; 0: the base model only)",
    "adapter_loads": "LoRA adapters copied into a device slot during the run (from host memory or disk)",
    "adapter_evictions": "LoRA adapters evicted from a device slot during the run",
    "steps": "engine steps the run took",
})
