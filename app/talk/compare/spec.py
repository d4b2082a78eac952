"""The `[compare]` section of a preset: what a chapter compares, on which workload, with which metrics.

    [compare]
    title = "static vs continuous batching"      # what the panel says it compares
    knob = "max_num_seqs"                         # with `values`: one configuration per value
    values = [1, 4, 16]
    metrics = ["tokens_per_s", "p99_e2e_ms"]      # names from METRICS
    headline = "tokens_per_s"                     # the number the chapter is about (default: the first metric)
    chart = ["tokens_per_s"]                      # drawn as bars (or a curve over a numeric knob)
    values_unit = "knee"                          # knob = "max_num_seqs" only: values are multiples of this
                                                  # machine's roofline knee (app/talk/compare/knee.py)
    not_built = "..."                             # instead of all the above: the feature does not exist yet

    [compare.engine]      base engine knobs for every configuration (EngineConfig fields)
    [compare.workload]    requests, prompt_tokens, output_tokens, arrival = "all" | "poisson" | "burst",
                          rate, burst_requests, burst_prompt_tokens, shared_prefix_tokens, seed, stop, warmup,
                          rate_unit ("capacity": rates as multiples of a measured capacity), rounds (the
                          configurations run in turn this many times, each figure the median of its rounds),
                          requests_per_batch (each configuration serves at least this many x its batch size)
    [[compare.configs]]   named configurations instead of knob/values: label, mode, and knob = value pairs

A configuration's `mode` says how it runs: "continuous" (the engine's own scheduling), "static" (the next
batch of max_num_seqs requests only when the whole previous one has finished), "recompute" (no KV cache:
every next token is a fresh request of prompt + tokens so far, prefix cache off), or "contiguous"
(computed, not run: the KV memory a max-length reservation per request would hold, from the previous
measured run). Errors are ValueError("key: message"); app/talk/presets.py adds the file and line.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from app.talk.compare.kinds import ArrivalMode, RateUnit, RunMode, Warmup
from app.talk.compare.metrics_catalog import METRICS
from engine.knobs import KNOB

MODES = tuple(RunMode)
ARRIVALS = tuple(ArrivalMode)
# EngineConfig fields a configuration may set, with the check of each value
ENGINE_KNOBS = {name: KNOB[name].type for name in (
    "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "policy", "enable_prefix_caching", "quant_bits",
    "quant_group_size", "compile", "fused_decode", "spec_method", "num_speculative_tokens", "num_kv_blocks",
    "memory_budget_bytes", "attention_backend", "pack_weights", "max_loras", "max_lora_rank", "max_cpu_loras",
    "max_step_ms", "ttft_budget_ms", "tpot_budget_ms")}
# workload keys a configuration may vary: rate (same prompts, scaled arrival times); adapters (distinct
# LoRA adapters named by the requests, round-robin; 0: the base model); streamed (false: the answer is
# delivered whole, so the first text a user sees comes at its end: "first_text" metrics)
WORKLOAD_KNOBS = {"rate": float, "adapters": int, "streamed": bool}
KNEE_KNOB = "max_num_seqs_knee"  # a configuration's batch as a multiple of the roofline's knee (values_unit)


class CompareSpecError(ValueError):
    def __init__(self, table: str, key: str | None, message: str) -> None:
        self.table, self.key, self.message = table, key, message
        super().__init__(f"[{table}] {key}: {message}" if key else f"[{table}]: {message}")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    requests: int = 8
    prompt_tokens: tuple[int, int] = (32, 64)
    output_tokens: tuple[int, int] = (16, 32)
    arrival: ArrivalMode = ArrivalMode.ALL
    rate: float = 4.0  # Poisson arrivals per second ("poisson"; the background stream of "burst")
    burst_requests: int = 0  # long prompts arriving at once, after the first `requests` began ("burst")
    burst_prompt_tokens: tuple[int, int] = (256, 384)
    shared_prefix_tokens: int = 0
    seed: int = 0
    stop: tuple[str, ...] = ()
    warmup: Warmup = Warmup.SHORT
    # "per_s": rates in requests/s; "capacity": multiples of the capacity measured first (app/talk/compare/capacity.py)
    rate_unit: RateUnit = RateUnit.PER_S
    # the configurations run in turn (A B C A B C ...) this many times and each figure is the median of its
    # rounds: a shared machine's speed drifts by tens of per cent over a minute, and a lone run of each
    # configuration puts that drift between them (app/talk/compare/runner.py)
    rounds: int = 1
    # each configuration serves max(requests, requests_per_batch x its max_num_seqs) requests (the first of
    # one plan): a batch sweep keeps every batch full without making batch 1 serve the largest one's load
    requests_per_batch: int = 0


@dataclass(frozen=True, slots=True)
class ConfigSpec:
    label: str
    knobs: dict = field(default_factory=dict)  # EngineConfig fields and workload knobs (rate)
    mode: RunMode = RunMode.CONTINUOUS


@dataclass(frozen=True, slots=True)
class CompareSpec:
    title: str
    configs: tuple[ConfigSpec, ...] = ()
    metrics: tuple[str, ...] = ("tokens_per_s",)
    chart: tuple[str, ...] = ()
    knob: str | None = None
    engine: dict = field(default_factory=dict)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    not_built: str | None = None
    checks: tuple = ()  # the chapter's claims on its own figures (app/talk/chapter_check.CheckSpec)
    fallback: CompareSpec | None = None  # the same comparison with a gentler knob, tried once if a claim breaks
    fallback_reason: str | None = None  # what the fallback changes, in words
    headline_metric: str | None = None  # the chapter's number (None: the first metric)

    @property
    def headline(self) -> str:
        return self.headline_metric or self.metrics[0]

    def fingerprint(self) -> str:
        """A short hash of everything that shapes the result (not the title): stored results are kept per
        configuration."""
        shape = {k: v for k, v in asdict(self).items()
                 if k not in ("title", "checks", "fallback", "fallback_reason", "headline_metric")}
        # defaults added later are left out: results stored before they existed still match
        if shape["workload"]["rate_unit"] == RateUnit.PER_S:
            del shape["workload"]["rate_unit"]
        if shape["workload"]["rounds"] == 1:  # likewise
            del shape["workload"]["rounds"]
        if shape["workload"]["requests_per_batch"] == 0:
            del shape["workload"]["requests_per_batch"]
        blob = json.dumps(shape, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _err(table: str, key: str, message: str, value) -> CompareSpecError:
    return CompareSpecError(table, key, f"{message}, got {json.dumps(value, default=str)}")


def _range(table: str, key: str, v) -> tuple[int, int]:
    if (not isinstance(v, list) or len(v) != 2 or any(isinstance(x, bool) or not isinstance(x, int) for x in v)
            or not 1 <= v[0] <= v[1]):
        raise _err(table, key, "expected [lo, hi], integers with 1 <= lo <= hi", v)
    return (v[0], v[1])


def _knob_value(table: str, key: str, v):
    want = ENGINE_KNOBS.get(key) or WORKLOAD_KNOBS.get(key)
    if want is None:
        raise _err(table, key, f"unknown knob; expected one of {', '.join([*ENGINE_KNOBS, *WORKLOAD_KNOBS])}", key)
    if key == "spec_method" and v in ("none", ""):
        return None
    ok = isinstance(v, want) and not (want is not bool and isinstance(v, bool))
    if want is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    if key == "adapters":
        ok = ok and 0 <= v <= 64
    if not ok:
        what = {"adapters": "an integer in [0, 64]"}.get(key) or ("a number > 0" if want is float else want.__name__)
        raise _err(table, key, f"expected {what}", v)
    return float(v) if want is float else v


def _workload(d: dict) -> WorkloadSpec:
    t = "compare.workload"
    if not isinstance(d, dict):
        raise CompareSpecError(t, None, "expected a table")
    out = {}
    for key, v in d.items():
        if key in ("prompt_tokens", "output_tokens", "burst_prompt_tokens"):
            out[key] = _range(t, key, v)
        elif key in ("requests", "burst_requests", "shared_prefix_tokens", "seed", "rounds", "requests_per_batch"):
            lo = 1 if key in ("requests", "rounds") else 0
            hi = {"rounds": 9, "requests_per_batch": 16}.get(key, 4096)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo or v > hi:
                raise _err(t, key, f"expected an integer in [{lo}, {hi}]", v)
            out[key] = v
        elif key == "rate":
            out[key] = _knob_value(t, key, v)
        elif key in ("arrival", "warmup", "rate_unit"):
            kind = {"arrival": ArrivalMode, "warmup": Warmup, "rate_unit": RateUnit}[key]
            if v not in tuple(kind):
                raise _err(t, key, f"expected one of {', '.join(kind)}", v)
            out[key] = kind(v)
        elif key == "stop":
            if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
                raise _err(t, key, "expected a list of non-empty strings", v)
            out[key] = tuple(v)
        else:
            raise _err(t, key, "unknown key; expected one of " + ", ".join(WorkloadSpec.__dataclass_fields__), key)
    return WorkloadSpec(**out)


def _names(table: str, key: str, v) -> tuple[str, ...]:
    if not isinstance(v, list) or not v or any(m not in METRICS for m in v):
        raise _err(table, key, f"expected a list of metric names from {', '.join(METRICS)}", v)
    return tuple(v)


def _configs(d: dict) -> tuple[ConfigSpec, ...]:
    knob, values, named = d.get("knob"), d.get("values"), d.get("configs")
    if named is not None:
        if knob is not None or values is not None:
            raise CompareSpecError("compare", "configs", "give either knob + values or [[compare.configs]], not both")
        if not isinstance(named, list) or not named:
            raise _err("compare", "configs", "expected one or more [[compare.configs]] tables", named)
        out = []
        for i, c in enumerate(named):
            t = f"compare.configs #{i + 1}"
            if not isinstance(c, dict) or not isinstance(c.get("label"), str) or not c["label"].strip():
                raise CompareSpecError(t, "label", "missing (a non-empty string)")
            mode = c.get("mode", RunMode.CONTINUOUS)
            if mode not in MODES:
                raise _err(t, "mode", f"expected one of {', '.join(MODES)}", mode)
            knobs = {k: _knob_value(t, k, v) for k, v in c.items() if k not in ("label", "mode")}
            out.append(ConfigSpec(c["label"].strip(), knobs, RunMode(mode)))
        if out[0].mode == RunMode.CONTIGUOUS:
            raise CompareSpecError("compare.configs #1", "mode",
                                   "a computed configuration needs a measured one before it")
        return tuple(out)
    if knob is None or values is None:
        raise CompareSpecError("compare", "knob", "missing: give knob + values or [[compare.configs]]")
    if not isinstance(values, list) or len(values) < 1:
        raise _err("compare", "values", "expected a list of one or more values", values)
    if knob not in ENGINE_KNOBS and knob not in WORKLOAD_KNOBS:
        raise _err("compare", "knob", f"unknown knob; expected one of {', '.join([*ENGINE_KNOBS, *WORKLOAD_KNOBS])}",
                   knob)
    unit = d.get("values_unit", "value")
    if unit not in ("value", "knee"):
        raise _err("compare", "values_unit", "expected value or knee", unit)
    if unit == "knee":
        if knob != "max_num_seqs":
            raise _err("compare", "values_unit", "knee: only for knob = \"max_num_seqs\"", knob)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 64 for v in values):
            raise _err("compare", "values", "with values_unit = \"knee\": multiples of the knee in (0, 64]", values)
        return tuple(ConfigSpec(f"{v:g}x knee", {KNEE_KNOB: float(v)}) for v in values)
    try:
        return tuple(ConfigSpec(f"{knob} = {v}", {knob: _knob_value("compare", knob, v)}) for v in values)
    except CompareSpecError as exc:
        raise CompareSpecError("compare", "values", f"{knob}: {exc.message}") from None


TOP_KEYS = ("title", "knob", "values", "values_unit", "configs", "metrics", "headline", "chart", "engine",
            "workload", "not_built", "checks", "fallback")


def parse_compare(d: dict) -> CompareSpec:
    """The [compare] table (as tomllib returns it) -> CompareSpec. Raises CompareSpecError."""
    if not isinstance(d, dict):
        raise CompareSpecError("compare", None, "expected a table")
    for key in d:
        if key not in TOP_KEYS:
            raise _err("compare", key, "unknown key; expected one of " + ", ".join(TOP_KEYS), key)
    title = d.get("title")
    if not isinstance(title, str) or not title.strip():
        raise CompareSpecError("compare", "title", "missing (a non-empty string)")
    if "not_built" in d:
        if not isinstance(d["not_built"], str) or not d["not_built"].strip():
            raise _err("compare", "not_built", "expected a non-empty string", d["not_built"])
        return CompareSpec(title=title.strip(), metrics=(), not_built=d["not_built"].strip())
    engine = d.get("engine", {})
    if not isinstance(engine, dict):
        raise CompareSpecError("compare.engine", None, "expected a table")
    engine = {k: _knob_value("compare.engine", k, v) for k, v in engine.items()}
    metrics = _names("compare", "metrics", d.get("metrics", ["tokens_per_s"]))
    chart = _names("compare", "chart", d["chart"]) if "chart" in d else metrics[:1]
    configs = _configs(d)
    headline = d.get("headline")
    if headline is not None and headline not in metrics:
        raise _err("compare", "headline", "expected one of this comparison's metrics", headline)
    fallback, reason = _fallback(d)
    return CompareSpec(title=title.strip(), configs=configs, metrics=metrics, chart=chart, knob=d.get("knob"),
                       engine=engine, workload=_workload(d.get("workload", {})),
                       checks=_checks(d.get("checks", []), metrics, tuple(c.label for c in configs)),
                       fallback=fallback, fallback_reason=reason, headline_metric=headline)


def _checks(raw, metrics: tuple[str, ...], labels: tuple[str, ...]) -> tuple:
    from app.talk.chapter_check import parse_check

    if not isinstance(raw, list):
        raise _err("compare", "checks", "expected one or more [[compare.checks]] tables", raw)
    out = []
    for i, c in enumerate(raw):
        try:
            out.append(parse_check(c, metrics, labels))
        except ValueError as exc:
            key, _, message = str(exc).partition(": ")
            raise CompareSpecError(f"compare.checks #{i + 1}", key, message) from None
    return tuple(out)


FALLBACK_KEYS = ("reason", "values", "engine", "workload")


def _fallback(d: dict) -> tuple[CompareSpec | None, str | None]:
    """[compare.fallback]: reason (words) and what it changes: `values` (the knob's), `engine` and
    `workload` keys (merged over [compare]'s). The same comparison, gentler, without checks of its own."""
    raw = d.get("fallback")
    if raw is None:
        return None, None
    t = "compare.fallback"
    if not isinstance(raw, dict):
        raise CompareSpecError(t, None, "expected a table")
    for key in raw:
        if key not in FALLBACK_KEYS:
            raise _err(t, key, "unknown key; expected one of " + ", ".join(FALLBACK_KEYS), key)
    if not isinstance(raw.get("reason"), str) or not raw["reason"].strip():
        raise CompareSpecError(t, "reason", "missing (what the fallback changes, and why)")
    gentler = {k: v for k, v in d.items() if k not in ("fallback", "checks")}
    if "values" in raw:
        if d.get("values") is None:
            raise CompareSpecError(t, "values", "only for a comparison with knob + values")
        gentler["values"] = raw["values"]
    for table in ("engine", "workload"):
        if table in raw:
            if not isinstance(raw[table], dict):
                raise CompareSpecError(f"{t}.{table}", None, "expected a table")
            gentler[table] = {**d.get(table, {}), **raw[table]}
    try:
        return parse_compare(gentler), raw["reason"].strip()
    except CompareSpecError as exc:
        raise CompareSpecError(f"{t} ({exc.table})", exc.key, exc.message) from None
