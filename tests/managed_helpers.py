"""A managed server for the app's tests: a tiny llama-server-like flag table whose program is the
stand-in (tests/managed_standin.py run by sys.executable), recording every argv it was started with."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from app.managed.server import ManagedServer
from app.managed.table import FlagError, FlagRow, ServedModel, ServerPoint

STANDIN = Path(__file__).parent / "managed_standin.py"


@dataclass(frozen=True)
class StandInEngine:
    """The stand-in's flag table (llama-server's spellings; a batch over max_np dies out of memory)."""
    argv_log: str
    request_log: str
    max_np: int = 16
    name: str = "stand-in"
    executable: str = sys.executable
    source: str = "tests/managed_standin.py"
    rows: tuple = (FlagRow("batch", "-np", "slots served at once"),
                   FlagRow("weight_format", "-m", "the GGUF of that format"),
                   FlagRow("draft", "--draft-max", "draft tokens per step (with -md)"))
    health_path: str = "/health"

    def argv(self, exe: str, model: ServedModel, point: ServerPoint, port: int,
             threads: int | None = None) -> list[str]:
        argv = [exe, str(STANDIN), "--port", str(port), "--log", self.request_log, "--argv-log", self.argv_log,
                "--max-np", str(self.max_np), "-np", str(point.batch), "-m", model.weights(point.weight_format)]
        if point.draft:
            if model.draft is None:
                raise FlagError("a draft length needs a draft model")
            argv += ["--draft-max", str(point.draft), "-md", model.draft]
        return argv


def standin_server(tmp_path: Path, point: ServerPoint | None = None) -> ManagedServer:
    engine = StandInEngine(str(tmp_path / "argv.jsonl"), str(tmp_path / "requests.jsonl"))
    model = ServedModel({"bf16": "/models/tiny-F16.gguf", "q8_0": "/models/tiny-Q8_0.gguf"}, draft="/models/draft.gguf",
                        name="tiny")
    return ManagedServer(engine, sys.executable, model, point or ServerPoint(batch=4), start_timeout_s=60.0)


def argv_lines(server: ManagedServer) -> list[list[str]]:
    path = Path(server.engine.argv_log)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def request_count(server: ManagedServer) -> int:
    path = Path(server.engine.request_log)
    return len(path.read_text().splitlines()) if path.exists() else 0



def standin_tune(tmp_path: Path, batches, formats, drafts, rates):
    """The app's tuning run (a TuneRun) of the real sweep (app/tradeoff/tune.py run_tune) on the
    stand-in: one server per point, a small seeded load and one greedy prompt each."""
    from app.tradeoff.tune import TuneSpec, run_tune
    from app.tradeoff.tune_measure import TuneLoad

    server = standin_server(tmp_path)
    points = tuple(ServerPoint(batch=n, weight_format=f, draft=d) for f in formats for d in drafts for n in batches)
    spec = TuneSpec(engine=server.engine, exe=server.exe, model=server.model, points=points,
                    load=TuneLoad(num_requests=2, rates=tuple(rates), chat_max_tokens=(4, 8), long_max_tokens=(4, 8),
                                  quality_prompts=1, quality_tokens=4), start_timeout_s=60.0)
    return lambda progress, on_point, cancelled: run_tune(spec, progress, on_point, cancelled)
