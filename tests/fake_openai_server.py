"""A stand-in OpenAI-compatible server, run as a child process by the peer-bench tests (in place of
llama-server or `inferlab serve`): GET /health, /v1/models; POST /v1/completions streamed or not, one
"tok" per output token, usage counting the prompt's token ids (or words). Every request body is
appended to --log as one JSON line. --short answers one token fewer than asked (a server that does
other work than asked).

As a managed server's stand-in (--accept-any, started behind a real engine's argv, e.g. llama-server's):
flags it does not know are ignored, except --refuse-flag=X (exit 1 at start with an argparse-like
error when X is in the argv: a flag the engine refuses) and --crash-flag=X --crash-after N (when X is in
the argv, the process dies after N completion requests: a crash mid-measurement)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def make_handler(log_path: str, short: bool = False, name: str = "fake",
                 crash_after: int = 0) -> type[BaseHTTPRequestHandler]:
    """The request handler class (stand-ins for other servers, tests/standin_server.py, subclass it);
    with `crash_after` > 0 the process dies on the completion request after that many."""
    lock = threading.Lock()
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/health":
                return self._send(200, {"status": "ok"})
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": name}]})
            self._send(404, {})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock, open(log_path, "a") as f:
                f.write(json.dumps(body) + "\n")
                served[0] += 1
                if crash_after and served[0] > crash_after:
                    print(f"crashing after {crash_after} requests", file=sys.stderr, flush=True)
                    os._exit(3)
            prompt = body["prompt"]
            n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
            n_out = body["max_tokens"] - (1 if short else 0)
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out}
            if not body.get("stream"):
                return self._send(200, {"choices": [{"text": "tok" * n_out, "finish_reason": "length"}],
                                        "usage": usage})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(n_out):
                reason = "length" if i == n_out - 1 else None
                self._event({"choices": [{"text": "tok", "finish_reason": reason}]})
            self._event({"choices": [], "usage": usage})
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

        def _event(self, payload: dict) -> None:
            self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        def _send(self, code: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def serve(port: int, handler: type[BaseHTTPRequestHandler]) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--short", action="store_true")
    p.add_argument("--name", default="fake")
    p.add_argument("--accept-any", action="store_true")
    p.add_argument("--refuse-flag", default=None)
    p.add_argument("--crash-flag", default=None)
    p.add_argument("--crash-after", type=int, default=0)
    args, unknown = p.parse_known_args() if "--accept-any" in sys.argv else (p.parse_args(), [])
    if args.refuse_flag and args.refuse_flag in unknown:
        print(f"error: invalid argument: {args.refuse_flag}", file=sys.stderr, flush=True)
        sys.exit(1)
    crash_after = args.crash_after if args.crash_flag and args.crash_flag in unknown else 0
    serve(args.port, make_handler(args.log, args.short, args.name, crash_after))


if __name__ == "__main__":
    main()
