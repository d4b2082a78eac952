"""A picture of File -> Tune a server…: the app's window with the dialog's sweep on the tradeoff panel and
the chosen point's command line under it (issue 29). Drives the app as a user would (the menu action,
the dialog's fields and Start), runs the real sweep (`inferlab tune`'s) on a real server, then saves the
window, the tradeoff panel alone and the sweep's JSON.

    python scripts/tune_screenshot.py --out /tmp/tune-shot --engine llama-server --batches "1, 4" --formats "bf16, q4_1"
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

SWEEP_TIMEOUT_S = 900.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder: window.png, tradeoff.png, tune.json")
    p.add_argument("--engine", default="llama-server")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batches", default="1, 4")
    p.add_argument("--formats", default="bf16, q4_1", help="weight formats by name (app/managed/formats.py)")
    p.add_argument("--drafts", default="0")
    p.add_argument("--rates", default="2")
    p.add_argument("--result", default=None, metavar="TUNE.json",
                   help="show a stored sweep (`inferlab tune --json`'s, or this script's tune.json) instead of "
                        "running one")
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication, QPushButton

    from app.gui.main_window import MainWindow
    from app.remote.source import RemoteSource

    app = QApplication.instance() or QApplication(sys.argv[:1])
    # the window's own source stays unstarted: the picture is of the sweep, which runs servers of its own
    window = MainWindow(RemoteSource("http://127.0.0.1:9"), None, persist=False)
    window.controller.interactive = False
    window.resize(1600, 1000)
    window.show()
    window.actions_by_name["tune"].trigger()
    dialog = window.tuning.dialog
    dialog.set_values({"engine": args.engine, "model": args.model, "batches": args.batches, "formats": args.formats,
                       "drafts": args.drafts, "rates": args.rates})
    if args.result:
        window.tuning.show_result(json.loads(Path(args.result).read_text()))
    else:
        dialog.findChild(QPushButton, "tune-start").click()
    deadline = time.monotonic() + SWEEP_TIMEOUT_S
    while window.tuning.result is None and dialog.is_running() and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.05)
    result = window.tuning.result
    if result is None:
        print(f"no result: {dialog.status_text()}", file=sys.stderr)
        return 1
    dock = window.docks["tradeoff"]
    dock.setFloating(True)  # the panel large, as a user would undock it to read the frontier
    dock.resize(1200, 700)
    dock.show()
    for _ in range(20):
        app.processEvents()
        time.sleep(0.05)
    window.flush_panels()
    app.processEvents()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.json").write_text(json.dumps(result, indent=1))
    window.panels.tradeoff.grab().save(str(out / "tradeoff.png"))
    dialog.grab().save(str(out / "dialog.png"))
    window.grab().save(str(out / "window.png"))
    print(f"{len(result['points'])} points, {len(result['failed'])} failed; chosen: {result.get('chosen')}\n"
          f"saved {out}/tradeoff.png, dialog.png, window.png, tune.json")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
