"""A job's events: sent by its callbacks on the scheduler thread, and read once, on the request's
event loop, into the pieces of its answer in one of the forms of forms.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from quickdraft.decoder import Decoder, GenerationOutput
from quickdraft.serve.api_errors import job_error
from quickdraft.serve.forms import Form
from quickdraft.serve.metrics import ServerMetrics
from quickdraft.stats import StepRecord

DISCONNECT_POLL_SECONDS = 0.2  # how often a non-streaming request checks that its client is still there


class ClientGone(Exception):
    """A client that is not streamed its answer hung up before the answer was ready."""


class JobEvents:
    """The queue between one job's callbacks and its answer, timed under `endpoint` from now.
    every_step: report every target pass (the steps view); stream: each step that made text or
    log-probabilities; otherwise only the first (its arrival is the time to the first token)."""

    def __init__(self, metrics: ServerMetrics, endpoint: str, every_step: bool, stream: bool) -> None:
        self.metrics, self.endpoint, self.arrived = metrics, endpoint, time.perf_counter()
        self.every_step, self.stream, self.reported = every_step, stream, False
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.cancelled = threading.Event()  # the job's: set when its answer ends, however it ends
        self.checked = time.monotonic()  # when a non-streaming client was last seen connected

    # The job's callbacks, on the scheduler thread: they only hand events to the event loop.

    def on_step(self, record: StepRecord, text: str) -> None:
        if self.every_step:
            self._put("step", (text, record.logprobs, record))
        elif not self.reported or (self.stream and (text or record.logprobs)):  # wake the loop only for news
            self.reported = True
            self._put("step", (text, record.logprobs))

    def on_finish(self, output: GenerationOutput, served_by: Decoder) -> None:
        self._put("done", (output, served_by))

    def on_error(self, message: str, status: int) -> None:
        self._put("error", (message, status))

    def _put(self, kind: str, payload: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is closed (shutdown): nobody is listening any more
            self.cancelled.set()

    # The one reader, on the request's event loop.

    async def pieces(self, form: Form, hangup: Request | None = None) -> AsyncIterator[Any]:
        """The answer's pieces in `form`, event by event, until the job is done or failed.
        hangup: a request to poll for its client leaving (then ClientGone)."""
        try:
            for piece in form.opening():
                yield piece
            first, kind = True, "step"
            while kind == "step":
                kind, payload = await self._next(hangup)
                if kind == "error":
                    written = form.error(job_error(*payload))
                elif kind == "step":
                    if first and form.timed_first_token:
                        self.metrics.first_token.labels(self.endpoint).observe(time.perf_counter() - self.arrived)
                    first, written = False, form.step(payload)
                else:
                    written = form.done(*payload)
                for piece in written:
                    yield piece
            if kind == "done":  # once its last pieces went out: all a streamed client waited
                self.metrics.latency.labels(self.endpoint).observe(time.perf_counter() - self.arrived)
            for piece in form.closing():
                yield piece
        finally:
            self.cancelled.set()  # a no-op once finished; frees the slot if the client went away

    async def _next(self, hangup: Request | None) -> tuple[str, Any]:
        """The next event; while waiting, `hangup`'s client checked every DISCONNECT_POLL_SECONDS."""
        if hangup is None:
            return await self.queue.get()
        while True:
            try:
                event = await asyncio.wait_for(self.queue.get(), DISCONNECT_POLL_SECONDS)
            except TimeoutError:
                event = None
            if time.monotonic() - self.checked >= DISCONNECT_POLL_SECONDS:
                self.checked = time.monotonic()
                if await hangup.is_disconnected():  # nobody will read the answer: free the slot now
                    raise ClientGone
            if event is not None:
                return event
