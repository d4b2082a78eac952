"""A request body that stalls (issue 48, point 6): the head's deadline was dropped once the head arrived,
and 1,100 connections that sent a head and then never their body were all held. The body has a deadline
of its own (not moved by data), and past the cap on open connections a request is answered 503; a
request that comes whole is served as before. A tiny app on 127.0.0.1 (the real API's own case is in
tests/test_server_strict.py)."""
from __future__ import annotations

import socket
import time

import httpx
import pytest
from fastapi import FastAPI, Request

from app.server.thread import ServerThread

HEAD = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"


def echo_app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        return {"bytes": len(await request.body())}

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}
    return app


@pytest.fixture
def server():
    with ServerThread(echo_app(), "127.0.0.1", 0, header_timeout_s=1.0, body_timeout_s=1.0,
                      max_connections=4) as srv:
        yield srv


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closes `sock` while we send `trickle` a byte each 0.2 s; None if it does
    not within `seconds`."""
    t0 = time.monotonic()
    sock.settimeout(0.2)
    pending = list(trickle)
    while time.monotonic() - t0 < seconds:
        if pending:
            try:
                sock.send(bytes([pending.pop(0)]))
            except OSError:
                return time.monotonic() - t0
        try:
            if sock.recv(1024) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


def test_a_body_that_never_comes_is_closed_at_its_deadline(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(HEAD + b'{"a": ')
        took = closed_within(sock, 6.0)
    assert took is not None and took < 4.0, took


def test_a_body_trickled_a_byte_at_a_time_is_cut_off(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(HEAD)
        took = closed_within(sock, 6.0, trickle=b'{"a": "' + b"x" * 90)
    assert took is not None and took < 4.0, took


def test_past_the_connection_cap_a_request_is_503_and_served_again_after(server):
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
    try:
        for sock in held:
            sock.sendall(HEAD + b"{")
        time.sleep(0.2)
        assert httpx.get(server.url + "/health", timeout=5).status_code == 503
        assert all(closed_within(sock, 6.0) is not None for sock in held)  # the stalled bodies' deadline
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200


def test_a_whole_body_is_served_and_a_kept_alive_connection_gets_fresh_deadlines(server):
    with httpx.Client(timeout=10) as client:
        for _ in range(3):
            reply = client.post(server.url + "/echo", content=b'{"a": 1}', headers={"Content-Type": "application/json"})
            assert reply.status_code == 200 and reply.json() == {"bytes": 8}
            time.sleep(0.6)  # (less than the head's deadline between requests)


def test_serve_takes_the_cap_and_refuses_none():
    import argparse

    from app.server.serve import add_serve_args

    parser = argparse.ArgumentParser()
    add_serve_args(parser, lambda p: p.add_argument("--model"))
    assert parser.parse_args(["--max-connections", "64"]).max_connections == 64
    assert parser.parse_args([]).max_connections == 512
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-connections", "0"])
