"""Continuous batching: one thread steps every active sequence together through the engine.

Requests wait in a bounded queue; between steps finished or abandoned sequences leave and
waiting ones join (those joining together are prefilled in one pass). Each step is the same
engine step a library call makes (engine.step): every drafter drafts for all of its sequences,
one target pass per backend verifies them all, and each sequence accepts its own number of
tokens. A request names its method and settings; its decoder shares the server's backends and
heads, and its sequence owns only its caches, which go when it finishes.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quickdraft.decoder import Decoder, GenerationOutput
from quickdraft.engine import Generation, prefill, step
from quickdraft.errors import QuickdraftError
from quickdraft.serve.metrics import ServerMetrics
from quickdraft.stats import StepRecord


class QueueFull(Exception):
    """The waiting queue is at its bound: the caller should answer 429."""


class ShuttingDown(Exception):
    """The server is stopping and takes no new work: the caller should answer 503."""


@dataclass
class Job:
    """One request's decoding work. The callbacks run on the scheduler thread and must be quick.

    method and settings: the request's drafting method and options (None and {}: the server's);
    on_step gets each step's record and the new text it made final (detokenized incrementally here)."""

    prompt_ids: list[int]
    max_new_tokens: int
    options: dict  # temperature, top_k, top_p, seed, stop
    method: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    on_step: Callable[[StepRecord, str], None] = lambda record, text: None
    on_finish: Callable[[GenerationOutput, Decoder], None] = lambda output, decoder: None
    on_error: Callable[[str, int], None] = lambda message, status: None  # status: 400 bad input, 500 ours
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)


@dataclass
class _Active:
    job: Job
    decoder: Decoder
    generation: Generation


DECODERS_KEPT = 32  # request decoders kept for reuse (they hold no caches: a few objects each)


class Scheduler:
    """Runs jobs in a background thread, at most `max_batch` at a time, `max_queue` waiting."""

    def __init__(
        self, decoder: Decoder, max_batch: int = 8, max_queue: int = 64, metrics: ServerMetrics | None = None
    ) -> None:
        if max_batch < 1 or max_queue < 1:
            raise QuickdraftError("max_batch and max_queue must be >= 1")
        if not decoder.batches_exactly and max_batch > 1:
            # Sequences sharing this llama.cpp's pool could change each other's bits: one at a time.
            warnings.warn(
                "quickdraft serve: this llama-cpp-python was built without patches/llama-cpp-ordered-cells.patch "
                "(./setup.sh builds it): requests sharing a pass could change each other's answers, so they "
                "are decoded one at a time (--max-batch 1)",
                stacklevel=2,
            )
            max_batch = 1
        self.decoder, self.max_batch, self.max_queue = decoder, max_batch, max_queue
        self.metrics = metrics or ServerMetrics()
        self._waiting: deque[Job] = deque()
        self._active: list[_Active] = []
        self._decoders: OrderedDict[tuple, Decoder] = OrderedDict()  # (method, settings) -> decoder, LRU
        self._lock = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="quickdraft-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new jobs, let running ones finish (up to `timeout` s), then cancel the rest."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline and (self._active or self._waiting):
            time.sleep(0.05)
        with self._lock:
            for job in [*self._waiting, *(a.job for a in self._active)]:
                if not job.cancelled.is_set():
                    job.on_error("the server shut down before this request finished", 503)
                job.cancelled.set()
            self._lock.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    @property
    def alive(self) -> bool:
        """Whether the decoding loop runs (a health check's question)."""
        return self._thread.is_alive()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._active)

    @property
    def kept_decoders(self) -> int:
        """Request decoders kept for reuse (bounded by DECODERS_KEPT; they hold no caches)."""
        return len(self._decoders)

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} waiting); retry later")
            self._waiting.append(job)
            self.metrics.queue_length.set(len(self._waiting))
            self._lock.notify_all()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._active and not self._waiting and not self._stopping:
                    self._lock.wait()
                if self._stopping and not self._active and not self._waiting:
                    return
            try:
                self._admit()
                self._drop_cancelled()
                if self._active:
                    self._step()
            except Exception as error:  # never leave clients waiting on a dead thread
                for active in self._active:
                    active.job.on_error(f"internal error while decoding: {error!r}", 500)
                self._active.clear()
                self.metrics.active.set(0)

    def _decoder_for(self, job: Job) -> Decoder:
        """The request's decoder: the server's, or another over the same models (cheap: shared parts),
        kept for the next request with the same settings so its cost model's timings carry over."""
        if job.method is None and not job.settings:
            return self.decoder
        key = (job.method, tuple(sorted((name, repr(value)) for name, value in job.settings.items())))
        decoder = self._decoders.pop(key, None) or self.decoder.with_method(job.method, **job.settings)
        self._decoders[key] = decoder
        while len(self._decoders) > DECODERS_KEPT:
            self._decoders.popitem(last=False)
        return decoder

    def _admit(self) -> None:
        joining: list[_Active] = []
        while len(self._active) + len(joining) < self.max_batch:
            with self._lock:
                if not self._waiting:
                    break
                job = self._waiting.popleft()
                self.metrics.queue_length.set(len(self._waiting))
            if job.cancelled.is_set():
                continue
            try:
                decoder = self._decoder_for(job)
                generation = decoder.prepare(job.prompt_ids, job.max_new_tokens, text=True, **job.options)
            except (QuickdraftError, ValueError) as error:  # e.g. an unknown method, a bad temperature
                job.on_error(str(error), 400)
                continue
            except Exception as error:  # a fault of ours: this request ends with it, no client waits on
                self._fail(job, f"internal error while preparing this request: {error!r}")
                continue
            joining.append(_Active(job, decoder, generation))
        if joining:
            try:
                prefill([a.generation for a in joining])  # those joining together: one pass
            except Exception as error:  # faults are kept per sequence; one that escapes ends them all
                for active in joining:
                    self._fail(active.job, f"internal error while reading this prompt: {error!r}")
                joining.clear()
            self._active.extend(a for a in joining if not self._failed(a))
        self.metrics.active.set(len(self._active))

    def _fail(self, job: Job, message: str) -> None:
        """A request ends with a 500 and its reason."""
        self.metrics.failed.inc()
        job.on_error(message, 500)

    def _drop_cancelled(self) -> None:
        for active in [a for a in self._active if a.job.cancelled.is_set()]:
            self._active.remove(active)
            self.metrics.cancelled.inc()
        self.metrics.active.set(len(self._active))

    def _failed(self, active: _Active) -> bool:
        """A sequence whose own work raised ends alone, with a 500 to its client; the batch goes on."""
        error = active.generation.error
        if error is None:
            return False
        self._fail(active.job, f"internal error while decoding this request: {error!r}")
        return True

    def _step(self) -> None:
        """One engine step for every active sequence, then report each one's progress."""
        records = step([a.generation for a in self._active])
        self.metrics.batch_size.observe(len(records))
        for active, record in zip(list(self._active), records):
            generation = active.generation
            if self._failed(active):
                self._active.remove(active)
                continue
            self.metrics.record_step(record)
            active.job.on_step(record, generation.text.delta())
            if generation.done:
                self._active.remove(active)
                active.job.on_finish(active.decoder.finish(generation), active.decoder)
                self.metrics.record_pools(self._pools())
        self.metrics.active.set(len(self._active))

    def _pools(self) -> list:
        """The pools of earlier outputs the server's drafters keep (suffix decoding), each once."""
        drafters = [self.decoder.drafter, *(decoder.drafter for decoder in self._decoders.values())]
        pools = (getattr(drafter, "pools", None) for drafter in drafters)
        return list({id(pool): pool for pool in pools if pool is not None}.values())
