"""A deadline for a request's headers: a connection that sends no complete request head within
HEADER_TIMEOUT_S of opening (or of its last response) is closed.

uvicorn's h11 protocol arms its keep-alive timer only after a response, and every byte received cancels
it: a client that connects and sends nothing, or trickles a header one byte a second (slowloris), holds a
connection (a file descriptor, a protocol object) for ever. This deadline is not moved by data: only a
whole request head stops it. Serve with `uvicorn.Config(app, http=header_timeout_protocol(...))`.
"""
from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0  # a client on a slow link sends a request head in well under a second
KEEP_ALIVE_S = 5  # uvicorn's default: an idle keep-alive connection is closed after this


class HeaderTimeoutProtocol(H11Protocol):
    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._arm_header_deadline()

    def handle_events(self) -> None:
        # runs on every chunk received, and when a keep-alive connection starts its next request
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a whole request head arrived (or the peer is gone)
            self._disarm_header_deadline()
        elif self._header_deadline is None:  # waiting for the next head: it gets the same deadline
            self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_timed_out)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_timed_out(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def header_timeout_protocol(header_timeout_s: float = HEADER_TIMEOUT_S) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn's `http=` with this deadline."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": float(header_timeout_s)})
