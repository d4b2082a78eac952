"""Deadlines for a request's head and body, and a cap on open connections.

A connection that sends no complete request head within HEADER_TIMEOUT_S of opening (or of its last
response) is closed, and so is one whose body does not arrive whole within BODY_TIMEOUT_S of its head.
uvicorn's h11 protocol arms its keep-alive timer only after a response, and every byte received cancels
it: a client that connects and sends nothing, trickles a header one byte a second (slowloris), or sends a
head and then never its body, holds a connection (a file descriptor, a protocol object, a task waiting
for the body) for ever: 1,100 stalled bodies were all held, none closed. These deadlines are not moved by
data: only a whole head, then a whole body, stops them. Past MAX_CONNECTIONS open connections a request
is answered 503 (uvicorn's limit_concurrency), so a flood ends in refusals, not in the process running out
of file descriptors. Serve with `uvicorn.Config(app, **serving_options(...))`.
"""
from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.server.deadlines import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, KEEP_ALIVE_S, MAX_CONNECTIONS


class HeaderTimeoutProtocol(H11Protocol):
    header_timeout_s = HEADER_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # "head" or "body": what the armed deadline waits for
        self._arm("head")

    def handle_events(self) -> None:
        # runs on every chunk received, and when a keep-alive connection starts its next request
        super().handle_events()
        state = self.conn.their_state
        waiting = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if waiting != self._waiting_for:  # a whole head (or body) arrived, or the next one is due
            self._arm(waiting)

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm(None)
        super().connection_lost(exc)

    def _arm(self, waiting_for: str | None) -> None:
        """A deadline for `waiting_for` ("head", "body"), counted from now; None: no deadline."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._waiting_for = waiting_for
        if waiting_for is not None:
            seconds = self.header_timeout_s if waiting_for == "head" else self.body_timeout_s
            self._deadline = self.loop.call_later(seconds, self._timed_out, waiting_for)

    def _timed_out(self, waiting_for: str) -> None:
        self._deadline = None
        if self._waiting_for == waiting_for and not self.transport.is_closing():
            self.transport.close()


def header_timeout_protocol(header_timeout_s: float = HEADER_TIMEOUT_S,
                            body_timeout_s: float = BODY_TIMEOUT_S) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn's `http=` with these deadlines."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,),
                {"header_timeout_s": float(header_timeout_s), "body_timeout_s": float(body_timeout_s)})


def serving_options(header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
                    max_connections: int = MAX_CONNECTIONS) -> dict:
    """uvicorn.Config's (or uvicorn.run's) keyword arguments for the deadlines and the connection cap."""
    return {"http": header_timeout_protocol(header_timeout_s, body_timeout_s), "timeout_keep_alive": KEEP_ALIVE_S,
            "limit_concurrency": max_connections + 1}  # (uvicorn counts the connection asking among them)
