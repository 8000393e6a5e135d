"""Bounds on what a client may hold open before the app sees its request: the seconds it has to
send a request's headers, and the connections one client address may keep at once.

uvicorn closes idle keep-alive connections and can cap concurrency in total, but a client that
trickles a header byte now and then, or opens hundreds of connections, holds them for ever. The
request body's own time limit is the gate's (gate.py), where the body is read.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

HEADER_SECONDS = 10.0
PER_CLIENT = 64
BODY_SECONDS = 30.0  # the gate's: a request's whole body must arrive within this


@dataclass(frozen=True)
class ConnectionLimits:
    header_seconds: float = HEADER_SECONDS  # from connecting (or the last response) to a request's last header
    per_client: int = PER_CLIENT  # connections open at once from one client address


DEFAULT_LIMITS = ConnectionLimits()


def refusal(status: str, reason: str) -> bytes:
    """A whole HTTP response that closes the connection (written before any request cycle exists)."""
    body = reason.encode()
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


def guarded_protocol(limits: ConnectionLimits, base: type[asyncio.Protocol] | None = None) -> type:
    """uvicorn's HTTP protocol (`base`; None: the one uvicorn would choose) with `limits`, counted
    per server: pass it as uvicorn.Config(http=...)."""
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base
    open_by_client: Counter[str] = Counter()  # this server's connections per client address

    class Guarded(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._header_timer: asyncio.TimerHandle | None = None
            self._address = self.client[0] if self.client else ""
            open_by_client[self._address] += 1
            if open_by_client[self._address] > limits.per_client:
                transport.write(
                    refusal(
                        "429 Too Many Requests",
                        f"this client has {limits.per_client} connections open, this server's limit per client",
                    )
                )
                transport.close()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            open_by_client[self._address] -= 1
            if open_by_client[self._address] <= 0:
                del open_by_client[self._address]
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # a request's headers are all in: the app has it

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # a kept-alive connection: the next request's headers get the same time

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(limits.header_seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _too_slow(self) -> None:
            self._header_timer = None
            if self.cycle is None or self.cycle.response_complete:  # still waiting for a request's headers
                if not self.transport.is_closing():
                    self.transport.write(
                        refusal(
                            "408 Request Timeout",
                            f"the request's headers did not arrive within {limits.header_seconds:g} s",
                        )
                    )
                    self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded
