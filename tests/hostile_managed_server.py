"""A hostile OpenAI-compatible server for the hardening tests of the managed servers and `inferlab tune`.

    python tests/hostile_managed_server.py --port P [--mode MODE ...] [anything a table appends: ignored]

It serves tests/fake_openai_server.py's handler, changed by each --mode (repeatable):
- ignore-term: SIGTERM is ignored (only SIGKILL ends it).
- --record FILE: each start appends its pid to FILE.
- fork-child: forks a child that keeps the listening socket open and sleeps (its pid goes to --pid-file),
  so the port stays taken after the parent exits.
- setsid-child: forks a child that leaves the process group (setsid()), ignores SIGTERM and sleeps up to
  ORPHAN_S (its pid goes to --pid-file): a signal to the server's group does not reach it.
- daemon-child: the same child forked twice (setsid() between), its parent gone at once: a daemon
  reparented to init, in no process tree of the server's.
- log:N: writes N MiB to stdout before serving (a server whose log is huge).
- metrics-nan / metrics-huge / metrics-endless: /metrics lies (NaN, -inf, 1e308 values and a string
  sample; a 12 MiB body; a body that never ends).
- models-invalid / models-empty: /v1/models answers invalid JSON / {"data": []}.
- stream-forever: a streamed completion never ends (one token, then an event without text every 10 ms,
  no finish: more tokens than asked for would end it at its own limit).
- greedy-huge: a non-streamed completion answers a 12 MiB body.
- ready-after:S: /health says 200 at once, but /v1/models and completions answer 503 for S seconds.
- refuse-completions: every completion answers 503 (/health 200 all along).
- usage-lies: a streamed completion's usage says 1000 times the tokens it sent.
- health-endless: /health answers 200 with a body that never ends (a byte every 10 ms).
- exit:N: exits with status N right after writing its log (log:M first), before serving.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import fake_openai_server  # noqa: E402  (tests/ is put on the path just above)

NAN_METRICS = ("# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio NaN\n"
               "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing -Inf\n"
               "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 1e308\n"
               "# TYPE llamacpp:spec_decode_num_accepted_tokens counter\n"
               "llamacpp:spec_decode_num_accepted_tokens +Inf\n"
               "# TYPE llamacpp:spec_decode_num_draft_tokens counter\nllamacpp:spec_decode_num_draft_tokens 0\n")


def hostile_handler(modes: set[str], log_path: str):
    base = fake_openai_server.make_handler(log_path)
    ready_at = time.monotonic() + next((float(m[12:]) for m in modes if m.startswith("ready-after:")), 0.0)

    class Hostile(base):
        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health" and "health-endless" in modes:
                self.send_response(200)
                self.end_headers()
                while True:
                    self.wfile.write(b"o")
                    self.wfile.flush()
                    time.sleep(0.01)
            if self.path == "/v1/models" and time.monotonic() < ready_at:
                return self._raw(503, b'{"error": {"message": "Loading model"}}')
            if self.path == "/metrics" and modes & {"metrics-nan", "metrics-huge", "metrics-endless"}:
                return self._metrics()
            if self.path == "/v1/models" and "models-invalid" in modes:
                return self._raw(200, b"{not json")
            if self.path == "/v1/models" and "models-empty" in modes:
                return self._raw(200, b'{"data": []}')
            return super().do_GET()

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if "refuse-completions" in modes or time.monotonic() < ready_at:
                return self._raw(503, b'{"error": {"message": "Loading model"}}')
            if body.get("stream") and "stream-forever" in modes and body.get("max_tokens", 0) > 4:
                return self._forever()
            if not body.get("stream") and "greedy-huge" in modes:
                return self._raw(200, b'{"choices": [{"text": "' + b"x" * (12 * 2**20) + b'"}]}')
            if "usage-lies" in modes and body.get("stream"):
                return self._lying_usage(body["max_tokens"])
            self.rfile = _Replay(json.dumps(body).encode())
            self.headers.replace_header("Content-Length", str(len(json.dumps(body).encode())))
            return super().do_POST()

        def _metrics(self) -> None:
            if "metrics-nan" in modes:
                return self._raw(200, NAN_METRICS.encode())
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            line = b"# HELP padding a line of nothing\n" * 1024
            rounds = 400 if "metrics-huge" in modes else 10**9
            for _ in range(rounds):
                self.wfile.write(line)
                if "metrics-endless" in modes:
                    time.sleep(0.01)
            self.close_connection = True

        def _lying_usage(self, n_out: int) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(n_out):
                self._event({"choices": [{"text": "tok", "finish_reason": "length" if i == n_out - 1 else None}]})
            self._event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1000 * n_out}})
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

        def _forever(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self._event({"choices": [{"text": "tok", "finish_reason": None}]})
            while True:
                self._event({"choices": [{"text": "", "finish_reason": None}]})
                time.sleep(0.01)

        def _raw(self, code: int, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Hostile


class _Replay:
    """The request body, read again by the base handler after this one looked at it."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, n: int) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        return out


class QuietServer(ThreadingHTTPServer):
    """A client that closes its connection early (the managed server's /health probe reads the status line
    only) is ordinary here: no traceback in the log after its last line (the log-tail test reads that line)."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


ORPHAN_S = 120.0  # a child that left the server's group lives at most this long whatever a test does


def _leave_the_group(pid_file: str | None, twice: bool) -> None:
    """Fork a child that calls setsid() (`twice`: which forks again and exits, as a daemon does) and sleeps
    up to ORPHAN_S ignoring SIGTERM, its pid in `pid_file`; the server itself returns at once."""
    if os.fork() != 0:
        if twice:
            os.wait()  # the middle process exits at once: the sleeper is reparented to init
        return
    os.setsid()
    if twice and os.fork() != 0:
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    time.sleep(ORPHAN_S)
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", action="append", default=[])
    p.add_argument("--pid-file", default=None, help="fork-child: where the child's pid goes")
    p.add_argument("--record", default=None, help="each start appends its pid here")
    p.add_argument("--log", default=os.devnull)
    args, _unknown = p.parse_known_args()
    modes = set(args.mode)
    if args.record:
        with open(args.record, "a") as f:
            f.write(f"{os.getpid()}\n")
    if "ignore-term" in modes:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for mode in modes:
        if mode.startswith("log:"):
            chunk = "x" * 1023 + "\n"
            for _ in range(int(mode[4:]) * 1024):
                sys.stdout.write(chunk)
            print("THE LAST LINE", flush=True)
    for mode in modes:
        if mode.startswith("exit:"):
            sys.exit(int(mode[5:]))
    for mode in ("setsid-child", "daemon-child"):  # (before the socket: the child does not hold the port)
        if mode in modes:
            _leave_the_group(args.pid_file, twice=mode == "daemon-child")
    server = QuietServer(("127.0.0.1", args.port), hostile_handler(modes, args.log))
    server.daemon_threads = True
    if "fork-child" in modes and os.fork() == 0:  # the child keeps the listening socket: the port stays taken
        if args.pid_file:
            Path(args.pid_file).write_text(str(os.getpid()))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(60)
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.serve_forever()


if __name__ == "__main__":
    main()
