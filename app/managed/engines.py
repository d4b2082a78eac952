"""The engines `inferlab tune --engine NAME` can manage: name -> that engine's flag table."""
from __future__ import annotations

from app.managed.inferlab_serve import InferlabServe
from app.managed.llama_server import LlamaServer
from app.managed.sglang import SglangEngine
from app.managed.table import ServerEngine
from app.managed.vllm import VllmEngine

ENGINES: dict[str, ServerEngine] = {
    "llama-server": LlamaServer(),
    "inferlab": InferlabServe(),
    "vllm": VllmEngine(),
    "sglang": SglangEngine(),
}
