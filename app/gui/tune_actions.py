"""File -> Tune a server…: what the dialog's buttons mean. The typed lists are parsed here (a bad one is
said in the dialog, nothing starts); the sweep (app/tradeoff/tune.py `run_tune`) runs in a
TuneWorker thread; its points go onto the tradeoff panel as they come, labelled with engine, model and
flags, and the finished sweep's frontier is drawn there with its chosen point's command line."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

from app.gui.tune_dialog import TuneDialog
from app.gui.tune_worker import TuneRun, TuneWorker
from app.managed.formats import (
    SERVER_FORMAT_BY_NAME,
    default_formats,
    formats_for,
    known_engine,
    parse_formats,
    server_format,
)
from app.managed.server import ManagedServer
from app.managed.table import ServedModel, ServerPoint
from widgets.tradeoff_points import server_label

STOP_WAIT_S = 5.0  # closing the window: how long to wait for a cancelled sweep to stop its server


@dataclass(frozen=True, slots=True)
class TuneChoice:
    """What the dialog asked for, parsed."""
    engine: str
    model: str
    batches: tuple[int, ...]
    formats: tuple[str, ...]  # weight formats by name (app/managed/formats.py)
    drafts: tuple[int, ...]
    rates: tuple[float, ...]

    @property
    def num_points(self) -> int:
        return len(self.batches) * len(self.formats) * len(self.drafts)


def parse_list(text: str, what: str, kind=int, minimum: float = 0) -> tuple:
    """"1, 4, 8" -> (1, 4, 8); ValueError naming the field for anything else."""
    items = [t for t in text.replace(",", " ").split() if t]
    if not items:
        raise ValueError(f"{what}: give at least one value")
    try:
        values = tuple(kind(t) for t in items)
    except ValueError:
        numbers = "whole numbers" if kind is int else "numbers"
        raise ValueError(f"{what}: {text.strip()!r} is not a list of {numbers}") from None
    bad = [v for v in values if v < minimum]
    if bad:
        raise ValueError(f"{what}: {bad[0]} is below {minimum}")
    return tuple(dict.fromkeys(values))


def parse_choice(values: dict) -> TuneChoice:
    if not values.get("engine"):
        raise ValueError("choose an engine")
    if not values.get("model"):
        raise ValueError("give a model (a .gguf file for llama-server, an HF folder or Hub id)")
    formats = parse_formats(values["formats"], known_engine(values["engine"]))  # ValueError naming the formats
    return TuneChoice(values["engine"], values["model"], parse_list(values["batches"], "batch sizes", int, 1),
                      formats, parse_list(values["drafts"], "draft lengths"),
                      parse_list(values["rates"], "arrival rates", float, 0.01))


class _Refusal(argparse.ArgumentParser):
    def error(self, message: str):
        raise ValueError(message)


def tune_args(choice: TuneChoice) -> argparse.Namespace:
    """`inferlab tune`'s own options for the choice (its defaults for everything the dialog does not ask)."""
    from app.tradeoff.tune_cli import add_tune_args

    parser = _Refusal(prog="inferlab tune")
    add_tune_args(parser)
    fmt = lambda values: [str(v) for v in values]  # noqa: E731
    return parser.parse_args(["--engine", choice.engine, "--model", choice.model, "--batch", *fmt(choice.batches),
                              "--formats", *choice.formats, "--draft", *fmt(choice.drafts),
                              "--rates", *fmt(choice.rates), "--json", "(the app)"])


def tune_runner(choice: TuneChoice) -> TuneRun:
    """The sweep the dialog runs: `inferlab tune`'s, with the chosen lists. Setting it up (finding the
    server, converting the model to GGUFs) and running it both happen in the worker thread."""
    from app.managed.setup import SetupError
    from app.tradeoff.tune import run_tune
    from app.tradeoff.tune_cli import make_spec

    args = tune_args(choice)

    def run(progress, on_point, cancelled) -> dict:
        try:
            spec = make_spec(args, lambda line: progress(line, 0.0))
        except SetupError as exc:
            raise RuntimeError(str(exc)) from None
        return run_tune(spec, progress=progress, on_point=on_point, cancelled=cancelled)
    return run


def engine_tables() -> dict:
    from app.managed.engines import ENGINES

    return dict(ENGINES)


def managed_at(result: dict, point: dict, table) -> ManagedServer:
    """The server of a tuning result's `point`, ready to start: the same executable, weights and point
    (the flag table `table` is the engine's own, as `--manage` uses it). ValueError (one line) for a result
    that names its weights by bit count (written before formats had names) or by a format `table` does not
    serve: a bit count names no format (q4_0 and q4_1 are both 4 bits), so it is not guessed."""
    model = result["model"]
    if "by_bits" in model or "bits" in point:
        raise ValueError("this tuning result names its weights by bit count (written before formats had names): "
                         "run the sweep again to start its points")
    by_format = model.get("by_format")
    if not isinstance(by_format, dict) or not all(isinstance(w, str) for w in by_format.values()):
        raise ValueError("this tuning result lists no weights per format")
    for name in (*by_format, point.get("weight_format")):
        server_format(name, known_engine(table.name))  # ValueError naming the formats the engine serves
    served = ServedModel(dict(by_format), draft=model.get("draft"), name=model["name"])
    knobs = ("batch", "weight_format", "kv_dtype", "draft", "chunked_prefill", "prefix_caching")
    return ManagedServer(table, result["executable"], served, ServerPoint(**{k: point[k] for k in knobs if k in point}),
                         threads=result.get("threads"))


def format_tip(engine: str) -> str:
    """The weight formats `engine` serves, each with its label and bits per weight (the dialog's tooltip)."""
    rows = (SERVER_FORMAT_BY_NAME[name] for name in formats_for(engine))
    return f"{engine}'s weight formats by name: " + "; ".join(
        f"{f.name} ({f.label}, {f.bits_per_weight:g} bits/weight{'' if f.makeable else ', its own checkpoint'})"
        for f in rows)


def model_name(result: dict) -> str:
    model = result.get("model")
    return str(model.get("name") or "") if isinstance(model, dict) else str(model or "")


class TuneActions:
    def __init__(self, window, engines: dict | None = None,
                 runner: Callable[[TuneChoice], TuneRun] = tune_runner) -> None:
        """engines: name -> flag table (app/managed/engines.py's ENGINES when None)."""
        self.window, self.runner = window, runner
        self.engines = engines
        self.dialog: TuneDialog | None = None
        self.worker: TuneWorker | None = None
        self.result: dict | None = None
        panel = window.panels.tradeoff
        panel.sigCopyText.connect(self.copy_command)
        panel.sigRunPoint.connect(self.run_point)

    def open(self) -> TuneDialog:
        if self.dialog is None:
            if self.engines is None:
                self.engines = engine_tables()
            self.dialog = TuneDialog({name: ", ".join(default_formats(name)) for name in self.engines}, self.window,
                                     tips={name: format_tip(name) for name in self.engines})
            self.dialog.sigStart.connect(self.start)
            self.dialog.sigCancel.connect(self.cancel)
        self.dialog.show()
        self.dialog.raise_()
        return self.dialog

    def start(self, values: dict) -> None:
        if self.worker is not None and self.worker.running():
            self.dialog.set_status("a sweep is already running")
            return
        try:
            choice = parse_choice(values)
            run = self.runner(choice)
        except (ValueError, RuntimeError) as exc:
            self.dialog.set_status(f"not started: {exc}")
            return
        self.result = None
        self.worker = TuneWorker(run, self.window)
        self.worker.sigProgress.connect(self._on_progress)
        self.worker.sigPoint.connect(self._on_point)
        self.worker.sigDone.connect(self.show_result)
        self.worker.sigFailed.connect(self._on_failed)
        self.dialog.set_running(True)
        self.dialog.set_progress(f"{choice.num_points} points of {choice.engine} serving {choice.model}…", 0.0)
        self._show_panel()
        self.worker.start()

    def cancel(self) -> None:
        if self.worker is not None and self.worker.running():
            self.worker.cancel()
            self.dialog.set_status("cancelling: the point under way is stopped, no other starts…")

    def shutdown(self) -> None:
        """The window closes: the sweep stops its current point's server at once (the sweep's watchdog) and
        starts no other; the process waits for that at exit."""
        if self.worker is not None and self.worker.running():
            self.worker.cancel()
            if not self.worker.join(STOP_WAIT_S):
                print("inferlab: the tuning sweep is stopping the server of the point under way",
                      file=sys.stderr)

    def copy_command(self, line: str) -> None:
        from PySide6.QtGui import QGuiApplication

        QGuiApplication.clipboard().setText(line)
        self.window.show_message("copied: " + line)

    def run_point(self, label: str):
        """A window on the chosen point's server, started as it ran in the sweep; its sliders restart it."""
        from app.managed.source import ManagedSource

        result = self.result or {}
        engine, model = result.get("engine"), model_name(result)
        point = next((p for p in result.get("points", []) if server_label(engine, model, p["label"]) == label), None)
        table = (self.engines or {}).get(engine)
        if point is None or table is None:
            self.window.show_message(f"{label}: not a point of the last sweep" if point is None
                                     else f"{engine}: no flag table to start it with")
            return None
        try:
            server = managed_at(result, point, table)
        except ValueError as exc:
            self.window.show_message(f"{label}: {exc}")
            return None
        self.window.show_message(f"starting {engine} at {point['label']} in a new window")
        return self.window.open_source_window(ManagedSource(server))

    # --- the worker's signals (GUI thread) -------------------------------------------------------
    def _on_progress(self, text: str, fraction: float) -> None:
        self.dialog.set_progress(text, fraction)
        self.window.show_message(f"tuning: {text}")

    def _on_point(self, p: dict) -> None:
        if not p.get("failed"):
            self.window.panels.tradeoff.add_server_point(p)

    def show_result(self, result: dict) -> None:
        """A finished sweep (or a stored one: `inferlab tune --json`'s file) on the tradeoff panel."""
        self.result = result
        self.open().set_running(False)
        panel = self._show_panel()
        engine, model = result["engine"], model_name(result)
        panel.set_server_sweep(engine, model, result.get("points", []),
                               [f["label"] for f in result.get("frontier", [])])
        chosen = result.get("chosen") or {}
        if chosen.get("label"):
            panel.select_point(server_label(engine, model, chosen["label"]))
        failed = result.get("failed", [])
        why = "".join(f"\n✗ {f['label']}: {f['reason'][:300]}" for f in failed)
        stopped = f" (stopped early: {result['stopped_early']})" if result.get("stopped_early") else ""
        when = f" (measured {result['measured_at']})" if result.get("measured_at") else ""
        text = (f"done{stopped}: {len(result.get('points', []))} points measured, {len(failed)} failed{when}; "
                f"they are on the tradeoff plot — click one for its command line{why}")
        self.dialog.set_status(text)
        self.window.show_message(text.splitlines()[0])

    def _show_panel(self):
        """The tradeoff panel, shown: a tuning sweep's points are its own data, whatever this window's source
        offers (an attached or managed window greys it out for the embedded sweep)."""
        panel = self.window.panels.tradeoff
        panel.set_available(True)
        self.window.docks["tradeoff"].show()
        self.window.docks["tradeoff"].raise_()
        return panel

    def _on_failed(self, message: str) -> None:
        self.dialog.set_running(False)
        self.dialog.set_status(f"the sweep stopped: {message}")
        self.window.show_message(f"the tuning sweep stopped: {message}")
