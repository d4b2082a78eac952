"""`inferlab bench host` in two checkouts, side by side: rounds alternate the two (ABBA order), each round one
process per checkout (`--rounds 1`), so both see the same drift of a shared machine; medians compared.

    python scripts/bench_host_ab.py --before ../base --after . --rounds 5 --json ab.json -- --threads 1 --dtype float32

Everything after `--` goes to `inferlab bench host` in both. Each checkout runs with its own code on
PYTHONPATH (the interpreter is this one: the same torch). Prints one JSON document."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_round(checkout: Path, bench_args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "host.json"
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        proc = subprocess.run([sys.executable, "-m", "app.cli", "bench", "host", "--rounds", "1", "--no-profile",
                               "--json", str(out), *bench_args], cwd=checkout, env=env, capture_output=True,
                              text=True, timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"{checkout}: bench host failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, type=Path)
    p.add_argument("--after", required=True, type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", metavar="OUT")
    p.add_argument("bench_args", nargs="*", help="after --: inferlab bench host's own options")
    args = p.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))  # ABBA: neither side always goes first
        for name in order:
            runs[name].append(one_round(sides[name], args.bench_args))
        loads.append(os.getloadavg()[0])
    first = runs["after"][0]
    result = {"benchmark": "host before/after", "time": time.strftime("%Y-%m-%d %H:%M:%S"),
              "checkouts": {k: str(v) for k, v in sides.items()}, "rounds": args.rounds,
              "bench_args": args.bench_args, "cpu": first["cpu"].get("model"), "threads": first["threads"],
              "cpu_tier": first["cpu_tier"], "engine": first["engine"], "vocab_size": first["vocab_size"],
              "noop_replaced": first["noop_replaced"], "clocks": first["clocks"],
              "load_average_each_round": [round(x, 2) for x in loads],
              "us_per_step": {}}
    for mode, by_streams in first["us_per_step"].items():
        for n in by_streams:
            row = {}
            for clock, key in (("wall", "median"), ("cpu", "cpu_median"), ("host", "host_median")):
                if any(key not in run["us_per_step"][mode][n] for name in sides for run in runs[name]):
                    continue  # (host_median: a checkout from before it, or no native rows kernel)
                each = {name: [run["us_per_step"][mode][n][key] for run in runs[name]] for name in sides}
                med = {name: statistics.median(v) for name, v in each.items()}
                row[clock] = {"before": round(med["before"], 1), "after": round(med["after"], 1),
                              "before_over_after": round(med["before"] / med["after"], 2), "each_round": each}
            result["us_per_step"][f"{mode} {n}"] = row
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
