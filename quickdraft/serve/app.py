"""The HTTP app: OpenAI's /v1/completions and /v1/chat/completions, quickdraft's own endpoints and
the playground, over the batch scheduler, behind the Gate."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI

from quickdraft.decoder import Decoder
from quickdraft.memory import loaded_memory
from quickdraft.serve.admission import Admission
from quickdraft.serve.answer import Answers
from quickdraft.serve.api_errors import add_error_handlers
from quickdraft.serve.connections import BODY_SECONDS
from quickdraft.serve.gate import LOOPBACK_HOSTS, Gate
from quickdraft.serve.metrics import ServerMetrics
from quickdraft.serve.routes import add_openai_routes, add_playground_routes, add_quickdraft_routes, add_service_routes
from quickdraft.serve.scheduler import Scheduler

MAX_BODY_BYTES = 2 << 20  # a context's worth of text or token ids is far less


def create_app(
    decoder: Decoder,
    model_name: str | None = None,
    max_batch: int = 8,
    max_queue: int = 64,
    max_tokens_limit: int = 2048,
    drain_seconds: float = 30.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    api_key: str | Sequence[str] | None = None,
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS,
    metrics_page: Callable[[], Awaitable[bytes]] | None = None,
    body_seconds: float = BODY_SECONDS,
    share_across_keys: bool = False,
) -> FastAPI:
    """A FastAPI app serving `decoder`'s target under `model_name` (default: its name).

    max_batch: sequences decoded together; max_queue: requests waiting beyond those (then 429);
    max_tokens_limit: the largest max_tokens a request may ask for; drain_seconds: how long a
    shutdown lets running requests finish (then they end with a 503); max_body_bytes: larger
    bodies get a 413; api_key: one key or several, required as a bearer token (None: open); each
    key's requests draft only from that key's earlier outputs (suffix decoding) unless
    share_across_keys; allowed_hosts: the Host
    names answered (None: any; the default suits a server bound to the loopback address);
    metrics_page: what /metrics shows (None: this server's metrics; on Ray Serve, every replica's);
    body_seconds: a request's body must all arrive within this (then 408)."""
    name = model_name or decoder.target.name
    metrics = ServerMetrics()
    metrics.record_memory(loaded_memory(decoder, max_batch))
    scheduler = Scheduler(decoder, max_batch, max_queue, metrics)
    admission = Admission(decoder, name, max_tokens_limit)
    answers = Answers(admission, scheduler, metrics)

    app = FastAPI(title="quickdraft", lifespan=_lifespan)
    # The lifespan, the error handlers and the background server find these here.
    app.state.scheduler, app.state.metrics, app.state.drain_seconds = scheduler, metrics, drain_seconds
    app.add_middleware(
        Gate,
        max_body_bytes=max_body_bytes,
        api_key=api_key,
        allowed_hosts=allowed_hosts,
        on_refused=lambda status: metrics.requests.labels("gate", str(status)).inc(),
        body_seconds=body_seconds,
        shared_tenant=share_across_keys,
    )
    add_error_handlers(app)
    add_service_routes(app, name, scheduler, metrics, metrics_page)
    add_openai_routes(app, admission, answers)
    add_quickdraft_routes(app, admission, answers)
    add_playground_routes(app)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The scheduler runs while the app does; at shutdown it drains for at most drain_seconds."""
    state = app.state
    state.scheduler.start()
    yield
    await asyncio.to_thread(state.scheduler.stop, state.drain_seconds)
