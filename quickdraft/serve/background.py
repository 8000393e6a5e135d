"""Running the app under uvicorn: a server whose shutdown has a time limit, in the foreground
(`quickdraft serve`) or in a thread of this process on a free localhost port (tests, benchmarks)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import uvicorn
from fastapi import FastAPI

from quickdraft.serve.connections import DEFAULT_LIMITS, ConnectionLimits, guarded_protocol

T = TypeVar("T")
GRACE_SECONDS = 5.0  # after the drain: for handlers to send their last bytes before uvicorn cancels them


def in_passing_thread(work: Callable[[], T]) -> T:
    """work() in a thread that ends with it. For loading the server's model: loading runs torch
    (pass shapes, warm-up), which leaves an OpenMP team behind on the thread that ran it; with
    the scheduler's own team beside it on the same cores, libgomp's workers sleep between
    parallel regions and every pass pays to wake them (decoding ran 25-35% slower on 2 cores).
    A finished thread's team goes with it, so the scheduler's thread is then torch's only one."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="quickdraft-load") as pool:
        return pool.submit(work).result()


class DrainingServer(uvicorn.Server):
    """uvicorn, but a shutdown (SIGTERM, Ctrl-C, stop()) first stops listening and drains the app's
    scheduler for at most app.state.drain_seconds: running requests finish or end with a clean
    503, their handlers return, and then uvicorn closes what is left (uvicorn alone would wait
    for every handler before the app's own drain could start)."""

    def __init__(
        self,
        app: FastAPI,
        host: str,
        port: int,
        limits: ConnectionLimits = DEFAULT_LIMITS,
        log_level: str = "warning",
    ) -> None:
        super().__init__(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level=log_level,
                timeout_graceful_shutdown=GRACE_SECONDS,
                http=guarded_protocol(limits),  # slow headers and crowds from one address are bounded
            )
        )
        self.app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections while the drain runs
        state = self.app.state
        await asyncio.to_thread(state.scheduler.stop, state.drain_seconds)
        await super().shutdown(sockets)


class BackgroundServer:
    """`app` served on 127.0.0.1 in a thread until stop(), which drains as `quickdraft serve` does."""

    def __init__(self, app: FastAPI, start_timeout: float = 30.0, limits: ConnectionLimits = DEFAULT_LIMITS) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.app = app
        self.server = DrainingServer(app, "127.0.0.1", self.port, limits)
        self.thread = threading.Thread(target=self.server.run, name="quickdraft-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
