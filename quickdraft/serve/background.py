"""Run the server in a thread of this process on a free localhost port (tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI


class BackgroundServer:
    """uvicorn serving `app` on 127.0.0.1 until stop(), which is graceful (requests in flight finish)."""

    def __init__(self, app: FastAPI, start_timeout: float = 30.0) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
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
