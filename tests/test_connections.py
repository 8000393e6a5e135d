"""What a client may hold before the app sees its request: seconds for its headers and for its
body, and connections per client address (uvicorn with quickdraft's protocol and gate)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from quickdraft.serve.connections import ConnectionLimits, guarded_protocol
from quickdraft.serve.gate import Gate

PARTIAL = b"GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: slow"  # headers that never end
WHOLE = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def hello(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@contextmanager
def served(limits: ConnectionLimits, body_seconds: float = 30.0) -> Iterator[int]:
    """A server with these limits on a free port, for the block's duration."""
    app = Gate(hello, max_body_bytes=1 << 20, allowed_hosts=None, body_seconds=body_seconds)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", http=guarded_protocol(limits)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def connect(port: int, data: bytes) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port), timeout=20)
    connection.sendall(data)
    return connection


def answer(connection: socket.socket) -> bytes:
    """Everything the server writes until it closes ("reset" when it closed with our bytes unread)."""
    chunks = []
    try:
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        chunks.append(b"reset")
    connection.close()
    return b"".join(chunks)


def test_slow_headers_and_crowds_from_one_address_are_cut_and_others_answered():
    limits = ConnectionLimits(header_seconds=1.0, per_client=16)
    with served(limits) as port:
        started = time.monotonic()
        slow = [connect(port, PARTIAL) for _ in range(300)]
        ends = []
        for connection in slow:
            ends.append((answer(connection), time.monotonic() - started))
        held = [(text, at) for text, at in ends if text.startswith(b"HTTP/1.1 408")]
        refused = [(text, at) for text, at in ends if not text.startswith(b"HTTP/1.1 408")]
        assert len(held) == 16 and all(0.9 < at < 8 for _, at in held)  # closed at the header deadline
        assert all(text.startswith(b"HTTP/1.1 429") or text == b"reset" for text, _ in refused)
        assert max(at for _, at in ends) < 8  # 300 slow clients held nothing for long
        assert answer(connect(port, WHOLE)).startswith(b"HTTP/1.1 200")  # and a normal request is answered


def test_a_kept_alive_connection_gets_the_same_time_for_its_next_headers():
    with served(ConnectionLimits(header_seconds=1.0, per_client=4)) as port:
        connection = connect(port, WHOLE)
        assert connection.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(0.5)
        connection.sendall(PARTIAL)  # a second request whose headers never end
        started = time.monotonic()
        assert answer(connection).startswith(b"HTTP/1.1 408") and time.monotonic() - started < 5


def test_a_body_that_does_not_arrive_in_time_gets_a_408():
    with served(ConnectionLimits(), body_seconds=1.0) as port:
        started = time.monotonic()
        trickle = connect(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        text = answer(trickle)
        assert text.startswith(b"HTTP/1.1 408") and b"request_timeout" in text
        assert 0.9 < time.monotonic() - started < 8
        assert answer(connect(port, WHOLE)).startswith(b"HTTP/1.1 200")
