"""A managed server for the app's tests: a tiny llama-server-like flag table whose program is the
stand-in (tests/managed_standin.py run by sys.executable), recording every argv it was started with."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from app.tradeoff.managed.server import ManagedServer
from app.tradeoff.managed.table import FlagError, FlagRow, ServedModel, ServerPoint

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
    rows: tuple = (FlagRow("batch", "-np", "slots served at once"), FlagRow("bits", "-m", "the GGUF for those bits"),
                   FlagRow("draft", "--draft-max", "draft tokens per step (with -md)"))
    health_path: str = "/health"

    def argv(self, exe: str, model: ServedModel, point: ServerPoint, port: int,
             threads: int | None = None) -> list[str]:
        argv = [exe, str(STANDIN), "--port", str(port), "--log", self.request_log, "--argv-log", self.argv_log,
                "--max-np", str(self.max_np), "-np", str(point.batch), "-m", model.weights(point.bits)]
        if point.draft:
            if model.draft is None:
                raise FlagError("a draft length needs a draft model")
            argv += ["--draft-max", str(point.draft), "-md", model.draft]
        return argv


def standin_server(tmp_path: Path, point: ServerPoint | None = None) -> ManagedServer:
    engine = StandInEngine(str(tmp_path / "argv.jsonl"), str(tmp_path / "requests.jsonl"))
    model = ServedModel({16: "/models/tiny-F16.gguf", 8: "/models/tiny-Q8_0.gguf"}, draft="/models/draft.gguf",
                        name="tiny")
    return ManagedServer(engine, sys.executable, model, point or ServerPoint(batch=4), start_timeout_s=60.0)


def argv_lines(server: ManagedServer) -> list[list[str]]:
    path = Path(server.engine.argv_log)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def request_count(server: ManagedServer) -> int:
    path = Path(server.engine.request_log)
    return len(path.read_text().splitlines()) if path.exists() else 0


def standin_tune(tmp_path: Path, batches, bits, drafts, rates, requests_per_rate: int = 2) -> dict:
    """Until the tuning sweep (app/tradeoff/managed/tune.py) is merged: a small sweep of the stand-in in
    the same result shape (one ManagedServer per point, a few timed requests per rate), for the app's
    dialog and frontier tests. Arguments: the TuneRun's (progress, on_point, cancelled) come later."""
    import itertools
    import shlex
    import time

    import httpx

    from app.tradeoff.frontier import pareto

    def run(progress, on_point, cancelled) -> dict:
        grid = list(itertools.product(batches, bits, drafts))
        points, failed, stopped = [], [], None
        for i, (batch, b, draft) in enumerate(grid, 1):
            if cancelled():
                stopped = "cancelled"
                break
            point = ServerPoint(batch=batch, bits=b, draft=draft)
            progress(f"point {i}/{len(grid)}: starting stand-in with {point.label()}", (i - 1) / len(grid))
            server = standin_server(tmp_path, point)
            row = {"engine": "stand-in", "model": "tiny", "label": point.label(), "batch": batch, "bits": b,
                   "draft": draft}
            try:
                server.start()
            except Exception as exc:  # noqa: BLE001 (PointFailed: a failed point, the sweep goes on)
                failed.append({**row, "failed": True, "reason": str(exc), "log_tail": getattr(exc, "log_tail", "")})
                on_point(failed[-1])
                continue
            row["command"] = shlex.join(server.command)
            row["flags"] = " ".join(server.command[server.command.index("-np"):])
            progress(f"point {i}/{len(grid)}: measuring at {rates[-1]} req/s", (i - 0.5) / len(grid))
            t0, tokens = time.perf_counter(), 0
            for _ in range(requests_per_rate):
                body = {"model": "tiny", "prompt": "a b c", "max_tokens": 4 * batch}
                tokens += httpx.post(server.url + "/v1/completions", json=body).json()["usage"]["completion_tokens"]
            wall = time.perf_counter() - t0
            server.stop()
            row.update(tokens_per_s_total=tokens / wall, tokens_per_s_user=tokens / wall / batch, agreement=None,
                       usd_per_mtok=2.5 / (tokens / wall * 3600) * 1e6)
            points.append(row)
            on_point(row)
        front = pareto(points, (lambda p: p["tokens_per_s_user"], lambda p: -p["usd_per_mtok"]))
        return {"engine": "stand-in", "model": {"name": "tiny"}, "points": points, "failed": failed,
                "frontier": [{"label": points[i]["label"]} for i in front],
                "chosen": {"label": points[front[0]]["label"]} if front else None, "stopped_early": stopped}
    return run
