"""The engines `inferlab tune --engine NAME` can manage: name -> that engine's flag table."""
from __future__ import annotations

from app.tradeoff.managed.inferlab_serve import InferlabServe
from app.tradeoff.managed.llama_server import LlamaServer
from app.tradeoff.managed.sglang import SglangEngine
from app.tradeoff.managed.table import ServerEngine
from app.tradeoff.managed.vllm import VllmEngine

ENGINES: dict[str, ServerEngine] = {
    "llama-server": LlamaServer(),
    "inferlab": InferlabServe(),
    "vllm": VllmEngine(),
    "sglang": SglangEngine(),
}
