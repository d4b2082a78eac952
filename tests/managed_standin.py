"""A stand-in for a managed server's executable (llama-server-like flags): it appends its argv to
--argv-log as one JSON line, refuses a batch over --max-np the way a server out of memory dies (a log
line, exit 1), and otherwise serves the project's fake OpenAI server (tests/fake_openai_server.py)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import fake_openai_server  # noqa: E402 (after its folder is on the path)


def main() -> None:
    with open(_value("--argv-log"), "a") as f:
        f.write(json.dumps(sys.argv) + "\n")
    p = argparse.ArgumentParser()
    p.add_argument("--port", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--argv-log", required=True)
    p.add_argument("-np", type=int, required=True)
    p.add_argument("-m", required=True)
    p.add_argument("--draft-max", type=int, default=0)
    p.add_argument("-md", default=None)
    p.add_argument("--max-np", type=int, default=16)
    args = p.parse_args()
    print(f"stand-in: loading {args.m} with {args.np} slots", flush=True)
    if args.np > args.max_np:
        print(f"stand-in: error: cannot allocate the KV cache for {args.np} slots (out of memory)", flush=True)
        sys.exit(1)
    sys.argv = [sys.argv[0], "--port", args.port, "--log", args.log, "--name", Path(args.m).stem]
    fake_openai_server.main()


def _value(flag: str) -> str:
    return sys.argv[sys.argv.index(flag) + 1]


if __name__ == "__main__":
    main()
