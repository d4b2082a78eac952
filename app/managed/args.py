"""`inferlab --manage ENGINE --model M`: the app on a server that inferlab starts and restarts (its
batch / weights / draft sliders restart it with the engine's own flags).

What the server loads comes from the rules `inferlab tune` uses too (app/managed/setup.py): for
llama-server a GGUF per weight format (--gguf-dir's files, else --model's weights converted once, with their
Q8_0 / Q4_1 variants) and the smallest GGUF as the draft model; --weights FORMAT=PATH overrides (formats by
name: app/managed/formats.py). Finding or
converting those files runs in the source's worker thread, before the server's first start, so the
window is up and says what it is doing meanwhile. (The CLI's parser reads this module's options: it
imports the source itself only when one is made.)"""
from __future__ import annotations

import argparse
from pathlib import Path

from app.managed.engines import ENGINES
from app.managed.formats import default_formats, formats_for
from app.managed.server import ManagedServer
from app.managed.setup import find_executable, served_model
from app.managed.table import ServedModel, ServerPoint

DRAFT_ON = (4,)  # any draft length: llama-server gets the smallest GGUF as its draft model


def add_manage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--manage", metavar="ENGINE", choices=list(ENGINES), default=None,
                   help="start ENGINE's server (" + ", ".join(ENGINES) + ") on --model and watch it; its batch, "
                        "weights and draft sliders restart it with the engine's own flags")
    p.add_argument("--server-bin", default=None, help="with --manage: the server's executable (default: looked up)")
    p.add_argument("--gguf-dir", default=None,
                   help="with --manage llama-server: a folder with a GGUF per weight format")
    p.add_argument("--weights", action="append", default=[], metavar="FORMAT=PATH",
                   help="with --manage: what the server loads for the weight format FORMAT, e.g. q4_1=m.gguf "
                        "(repeatable; formats: " + ", ".join(formats_for(None)) + ")")
    p.add_argument("--port", type=int, default=None,
                   help="with --manage: the server's port, kept across restarts (default: a free loopback port)")


def managed_source(args):
    """The source for `--manage` (a ManagedSource); ValueError (one line) when the server's executable is
    not found."""
    from app.managed.source import ManagedSource  # httpx and the worker: only once the app runs

    engine = ENGINES[args.manage]
    exe = find_executable(engine, args.server_bin)  # SetupError is a ValueError
    choice = argparse.Namespace(model=args.model, gguf_dir=args.gguf_dir, weights=args.weights,
                                formats=list(default_formats(engine.name)), draft=list(DRAFT_ON))
    server = ManagedServer(engine, exe, ServedModel(name=Path(args.model).name or args.model), ServerPoint(),
                           threads=args.threads, port=getattr(args, "port", None))
    return ManagedSource(server, setup=lambda say: served_model(choice, engine, say)[0])
