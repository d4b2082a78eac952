#!/usr/bin/env python
"""Leave every preset running for a while and say whether it keeps up with its own arrivals.

    python scripts/soak_presets.py [--seconds 120] [--out DIR] [PRESET ...]

Each preset runs in the real app (headless, its cues included) for --seconds; app/gui/soak.py samples the
queue, goodput and latency every 5 s. Prints one line per preset and writes DIR/NAME.json (the samples)
and DIR/summary.json. Exit status 1 when a preset's queue grows (a preset must not open a meltdown).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

RUN_APP = "import sys; from app.cli import main; sys.exit(main())"  # the `inferlab` command, this Python


def main() -> int:
    here = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(here))
    from app.talk import presets

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("presets", nargs="*", default=presets.available())
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=Path("soak"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary, bad = {}, []
    for name in args.presets:
        report = args.out / f"{name}.json"
        cmd = [sys.executable, "-c", RUN_APP, "--screenshot", str(args.out / f"{name}.png"), "--preset", name,
               "--run-seconds", str(args.seconds), "--report", str(report)]
        done = subprocess.run(cmd, cwd=here, capture_output=True, text=True)
        if done.returncode != 0 or not report.exists():
            summary[name] = {"verdict": "failed", "error": done.stderr.strip().splitlines()[-1:]}
            bad.append(name)
        else:
            r = json.loads(report.read_text())
            summary[name] = {k: v for k, v in r.items() if k != "samples"}
            if r["verdict"] == "queue grows":
                bad.append(name)
        s = summary[name]
        share = s.get("goodput_share_at_end")
        print(f"{name:24s} {s['verdict']:18s} waiting: end {s.get('waiting_at_end')} max {s.get('max_waiting')}"
              f" · goodput at the end {'-' if share is None else f'{100 * share:.0f} %'}", flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
