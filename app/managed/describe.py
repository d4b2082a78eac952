"""One engine's flag table as Markdown: which flag carries each knob, where the spelling was read, and the
launch line the table itself builds for a plain point (what `inferlab tune --engine X --show-flags`
prints and what docs/servers.md shows)."""
from __future__ import annotations

import shlex

from app.managed.formats import REFERENCE
from app.managed.table import ServedModel, ServerEngine, ServerPoint

EXAMPLE_PORT = 8000


def describe_table(engine: ServerEngine) -> str:
    lines = [f"{engine.name}: flags read from {engine.source}", "",
             "| knob | flag | meaning |", "| --- | --- | --- |"]
    lines += [f"| {row.knob} | `{_cell(row.flag)}` | {_cell(row.meaning)} |" for row in engine.rows]
    example = engine.argv(engine.executable, ServedModel({REFERENCE: "CHECKPOINT"}, name="NAME"), ServerPoint(),
                          EXAMPLE_PORT)
    lines += ["", f"Launch line at batch 8, {REFERENCE} weights, the engine's defaults otherwise: "
                  f"`{shlex.join(example)}`"]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
