"""Where inductor keeps the code it compiles in this process: set once, when engine.models.layers is imported
(before any of our regions, or anything else, is compiled)."""
from __future__ import annotations

import os
import re


def inductor_cache_per_isa() -> None:
    """Give inductor's compiled code its own cache folder per forced ISA. inductor generates vector code
    for the ISA that ATEN_CPU_CAPABILITY names (an AVX2 machine's, say, on an AVX-512 one), but its FX
    graph cache key (torch 2.13) leaves that ISA out: a graph compiled at AVX-512 (32 bf16 lanes) was
    then served to an AVX2 run, its code rebuilt against AVX2's 16-lane vectors, and every decode step
    answered NaN. Only where ATEN_CPU_CAPABILITY is set and the folder is inductor's default (unset, or
    set to the default by inductor itself, which writes it into the environment when it first looks):
    then the default folder plus the ISA's name. A folder the user chose is left alone."""
    capability = re.sub(r"[^a-z0-9_]", "", os.environ.get("ATEN_CPU_CAPABILITY", "").lower())[:32]
    if not capability:
        return
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not chosen or os.path.abspath(chosen) == default:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default}-{capability}"
