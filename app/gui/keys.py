"""The app's keyboard shortcuts as data: the menus bind them, `inferlab --help` and docs/app.md list them."""
from __future__ import annotations

KEYS: tuple[tuple[str, str], ...] = (
    ("Space", "start / stop the load generator"),
    ("B", "a burst of long prompts"),
    ("N", "play the preset's next cue now (its scripted burst or knob change)"),
    ("M", "measure the chapter's comparison now, side by side on the same workload"),
    ("R", "reset: stop the load, abort every request, clear the panels"),
    ("C", "chunked prefill on / off"),
    ("K", "torch.compile of the dense layers on / off"),
    ("S", "run the tradeoff sweep (the explorer: batch x weight bits x drafts on engines of its own)"),
    ("PgDown / PgUp", "next / previous chapter of the talk (presets/talk.toml)"),
    ("F11", "presenter mode: full screen, large fonts, only the preset's panels"),
    ("Ctrl+Enter", "send the prompt typed in the token stream"),
    ("Ctrl+T", "tune a server: sweep a managed server's flags onto the tradeoff plot"),
    ("Ctrl+Q", "quit"),
)


def keys_help() -> str:
    width = max(len(k) for k, _ in KEYS)
    return "\n".join(f"  {k:<{width}}  {text}" for k, text in KEYS)
