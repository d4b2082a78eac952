"""ModelConfig: the architecture facts the engine reads from a Hugging Face config.json.

Architectures are recognised by what the config says (keys and values), never by guessing from a name.
Every count, size and constant is checked for its type and range here, before anything is built: a config
asking for 100,000 layers grew to 2.8 GB building them, a max_position_embeddings of 2^62 overflowed the
RoPE table. Counts and sizes are then checked against the weight files' headers (engine/loading/shapes.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
MAX_LAYERS = 1024  # the largest open models have ~130; each layer is built as modules before its weights
MAX_POSITIONS = 2**21  # Qwen2.5-1M says 1,010,000; RoPE keeps a table row for every position
MAX_SIZE = 2**22  # vocabulary, hidden and intermediate sizes (the weights must match them too)
MAX_HEADS = 2**12
MAX_HEAD_DIM = 2**12


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool  # RMSNorm on q and k per head before RoPE (Qwen3)
    rope_scaling: dict[str, Any] | None = None
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        model_type = cfg.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; inferlab runs {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {str(cfg.get('hidden_act'))[:40]!r}; only silu (SwiGLU) is "
                             "supported")
        _check_counts(cfg)
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        # Qwen2 always has q/k/v bias; Llama-family configs say so with attention_bias.
        bias = bool(cfg.get("attention_bias", model_type == "qwen2"))
        rope_scaling = cfg.get("rope_scaling")
        if rope_scaling is not None and not isinstance(rope_scaling, dict):
            raise ValueError(f"rope_scaling is {str(rope_scaling)[:40]}: an object was expected")
        rope_theta = cfg.get("rope_theta")
        rope_params = cfg.get("rope_parameters")  # transformers >= 5 folds theta and scaling in here
        if isinstance(rope_params, dict):
            rope_theta = rope_theta or rope_params.get("rope_theta")
            if rope_params.get("rope_type", "default") != "default" and not rope_scaling:
                rope_scaling = rope_params
        if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) in (None, "default"):
            rope_scaling = None
        _check_constants(cfg, rope_theta, head_dim, rope_scaling)
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta or 10000.0),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bias,
            qk_norm=model_type == "qwen3",
            rope_scaling=rope_scaling,
            hidden_act=cfg.get("hidden_act", "silu"),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V for one token across all layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes


def _whole(cfg: dict[str, Any], key: str, high: int, required: bool = True) -> None:
    """cfg[key] is a whole number in 1..high (absent: fine where not `required`); ValueError naming it."""
    if key not in cfg and not required:
        return
    value = cfg[key]
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ValueError(f"{key} is {str(value)[:40]}: a whole number from 1 to {high:,} was expected")


def _check_counts(cfg: dict[str, Any]) -> None:
    """The counts and sizes: whole numbers in range, heads a multiple of key-value heads."""
    for key in ("vocab_size", "hidden_size", "intermediate_size"):
        _whole(cfg, key, MAX_SIZE)
    _whole(cfg, "num_hidden_layers", MAX_LAYERS)
    _whole(cfg, "num_attention_heads", MAX_HEADS)
    _whole(cfg, "num_key_value_heads", MAX_HEADS, required=False)
    _whole(cfg, "head_dim", MAX_HEAD_DIM, required=False)
    _whole(cfg, "max_position_embeddings", MAX_POSITIONS, required=False)
    kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    if cfg["num_attention_heads"] % kv_heads:
        raise ValueError(f"num_attention_heads {cfg['num_attention_heads']} is not a multiple of "
                         f"num_key_value_heads {kv_heads}")


def _positive(value: Any, key: str, high: float = math.inf) -> None:
    """A finite number above 0 (and below `high`); ValueError naming `key` else."""
    try:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an int past a float's range
        number = math.inf
    if not 0 < number < high:
        raise ValueError(f"{key} is {str(value)[:40]}: a finite number above 0"
                         f"{'' if high == math.inf else f' and below {high:g}'} was expected")


def _check_constants(cfg: dict[str, Any], rope_theta: Any, head_dim: int, rope_scaling: Any) -> None:
    """RoPE's base, the norm's epsilon and the RoPE scaling's numbers: finite and above 0; an even head_dim."""
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim is {head_dim}: RoPE rotates pairs, an even head_dim of 2 or more was expected")
    if rope_theta is not None:
        _positive(rope_theta, "rope_theta")
    _positive(cfg.get("rms_norm_eps", 1e-6), "rms_norm_eps", 1.0)
    if rope_scaling is None:
        return
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if kind in ("linear", "llama3"):
        _positive(rope_scaling.get("factor"), "rope_scaling.factor")
    if kind == "llama3":
        _whole(rope_scaling, "original_max_position_embeddings", MAX_POSITIONS)
        low, high = rope_scaling.get("low_freq_factor", 1.0), rope_scaling.get("high_freq_factor", 4.0)
        _positive(low, "rope_scaling.low_freq_factor")
        _positive(high, "rope_scaling.high_freq_factor")
        if not high > low:
            raise ValueError(f"rope_scaling.high_freq_factor {high} is not above low_freq_factor {low}")
