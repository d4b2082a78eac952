"""The line of a key in a TOML text, for file:line errors (tomllib gives no value lines). Tables: a name
("compare", "compare.engine", "compare.fallback (...)") or "NAME #N", the N-th [[NAME]] of an array of
tables ("compare.configs #2", "chapter #3" in presets/talk.toml)."""
from __future__ import annotations

import re


def compare_line(text: str, table: str, key: str | None) -> int | None:
    want, nth = table.split(" (", 1)[0], 1
    m = re.fullmatch(r"([A-Za-z0-9_.-]+) #(\d+)", table)
    if m:
        want, nth = m.group(1), int(m.group(2))
    seen, inside, header = 0, False, None
    for i, line in enumerate(text.splitlines(), 1):
        s = line.split("#", 1)[0].strip()
        h = re.fullmatch(r"\[\[?\s*([A-Za-z0-9_.-]+)\s*\]\]?", s)
        if h:
            inside = h.group(1) == want and (seen := seen + (h.group(1) == want)) == nth
            if inside:
                header = i
            continue
        if inside and key is not None and re.match(rf"^{re.escape(key)}\s*=", s):
            return i
    return header
