"""Continuous batching: one thread steps every active sequence together, one target pass per step.

Requests wait in a bounded queue; between steps finished or abandoned sequences leave and
waiting ones join (their prompt is prefilled as they join). Each step every sequence drafts
on its own, then all verify in one batched target pass (`forward_batch`): their tokens are
stacked as rows so the weights are read once, attention runs per sequence over that
sequence's own cache, and each accepts its own number of tokens (its cache pointer moves
alone). Sequences whose target is not on the native runner are verified one by one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from quickdraft.decoder import Decoder, GenerationOutput
from quickdraft.engine import Generation, PassPlan
from quickdraft.errors import QuickdraftError
from quickdraft.models.native import NativeRunner, Segment, forward_batch
from quickdraft.serve.metrics import ServerMetrics
from quickdraft.stats import StepRecord


class QueueFull(Exception):
    """The waiting queue is at its bound: the caller should answer 429."""


class ShuttingDown(Exception):
    """The server is stopping and takes no new work: the caller should answer 503."""


@dataclass
class Job:
    """One request's decoding work. The callbacks run on the scheduler thread and must be quick."""

    prompt_ids: list[int]
    max_new_tokens: int
    options: dict  # temperature, top_k, top_p, seed, stop
    method: str | None = None
    k: int | None = None
    on_step: Callable[[StepRecord, list[int]], None] = lambda record, new_tokens: None
    on_finish: Callable[[GenerationOutput, Decoder], None] = lambda output, decoder: None
    on_error: Callable[[str, int], None] = lambda message, status: None  # status: 400 bad input, 500 ours
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)


@dataclass
class _Active:
    job: Job
    decoder: Decoder
    generation: Generation
    key: tuple  # (method, k): where the decoder goes back to when the job leaves


class Scheduler:
    """Runs jobs in a background thread, at most `max_batch` at a time, `max_queue` waiting."""

    def __init__(self, decoder: Decoder, max_batch: int = 8, max_queue: int = 64,
                 metrics: ServerMetrics | None = None) -> None:
        if max_batch < 1 or max_queue < 1:
            raise QuickdraftError("max_batch and max_queue must be >= 1")
        self.decoder, self.max_batch, self.max_queue = decoder, max_batch, max_queue
        self.metrics = metrics or ServerMetrics()
        self._waiting: deque[Job] = deque()
        self._active: list[_Active] = []
        self._idle: dict[tuple, list[Decoder]] = {}  # (method, k) -> decoders free for reuse
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
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._active)

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} waiting); retry later")
            self._waiting.append(job)
            self.metrics.queue_length.set(len(self._waiting))
            self._lock.notify_all()

    def _decoder_for(self, key: tuple) -> Decoder:
        """A decoder of its own for one sequence (own caches and drafter), reused across requests."""
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                return idle.pop()
        return self.decoder.with_method(*key)

    def _release(self, decoder: Decoder, key: tuple) -> None:
        with self._lock:
            self._idle.setdefault(key, []).append(decoder)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._active and not self._waiting and not self._stopping:
                    self._lock.wait()
                if self._stopping and not self._active and not self._waiting:
                    return
            self._admit()
            self._drop_cancelled()
            if not self._active:
                continue
            try:
                self._step()
            except Exception as error:  # never leave clients waiting on a dead thread
                for active in self._active:
                    active.job.on_error(f"internal error while decoding: {error!r}", 500)
                self._active.clear()
                self.metrics.active.set(0)

    def _admit(self) -> None:
        while len(self._active) < self.max_batch:
            with self._lock:
                if not self._waiting:
                    return
                job = self._waiting.popleft()
                self.metrics.queue_length.set(len(self._waiting))
            if job.cancelled.is_set():
                continue
            key = (job.method or self.decoder.method, job.k)
            try:
                decoder = self._decoder_for(key)
            except QuickdraftError as error:  # e.g. an unknown method
                job.on_error(str(error), 400)
                continue
            try:
                generation = decoder.start(job.prompt_ids, job.max_new_tokens, **job.options)  # prefill
            except (QuickdraftError, ValueError) as error:
                self._release(decoder, key)
                job.on_error(str(error), 400)
                continue
            self._active.append(_Active(job, decoder, generation, key))
        self.metrics.active.set(len(self._active))

    def _drop_cancelled(self) -> None:
        for active in [a for a in self._active if a.job.cancelled.is_set()]:
            self._active.remove(active)
            self._release(active.decoder, active.key)
            self.metrics.cancelled.inc()
        self.metrics.active.set(len(self._active))

    def _step(self) -> None:
        """Draft for every active sequence, verify them all in one batched pass, then emit."""
        plans: list[PassPlan] = [a.generation.plan() for a in self._active]
        logits = self._verify_all(plans)
        self.metrics.batch_size.observe(len(plans))
        for active, plan, rows in zip(list(self._active), plans, logits):
            generation = active.generation
            record = generation.complete(plan, rows)
            self.metrics.record_step(record)
            active.job.on_step(record, generation.new_tokens)
            if generation.done:
                self._active.remove(active)
                output = active.decoder.finish(generation, active.job.options.get("stop"))
                self._release(active.decoder, active.key)
                active.job.on_finish(output, active.decoder)
        self.metrics.active.set(len(self._active))

    def _verify_all(self, plans: list[PassPlan]) -> list:
        runners = [a.generation.target for a in self._active]
        native = [i for i, r in enumerate(runners) if isinstance(r, NativeRunner)]
        logits: list = [None] * len(plans)
        groups: dict[int, list[int]] = {}
        for i in native:  # one batched pass per set of shared weights (e.g. per precision)
            groups.setdefault(id(runners[i].weights), []).append(i)
        for members in groups.values():
            segments = [Segment(runners[i], plans[i].inputs, True, plans[i].positions, plans[i].mask)
                        for i in members]
            for i, rows in zip(members, forward_batch(segments)):
                logits[i] = rows
        for i, plan in enumerate(plans):
            if logits[i] is None:
                logits[i] = runners[i].forward(plan.inputs, positions=plan.positions, mask=plan.mask)
        return logits
