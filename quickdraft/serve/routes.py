"""The endpoints, one family to a function: the service's health, metrics and models; OpenAI's
completions and chat; quickdraft's own /v1/quickdraft/*; the playground's files."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response

from quickdraft.methods import METHODS
from quickdraft.serve.admission import Admission
from quickdraft.serve.answer import Answers
from quickdraft.serve.api_errors import ApiError
from quickdraft.serve.metrics import ServerMetrics
from quickdraft.serve.protocol import ChatCompletionRequest, CompletionRequest
from quickdraft.serve.scheduler import Scheduler

PLAYGROUND = Path(__file__).parent / "static"  # the playground page: no build step, no CDN
PLAYGROUND_FILES = {"playground.js": "text/javascript", "playground.css": "text/css"}


def add_service_routes(
    app: FastAPI,
    model: str,
    scheduler: Scheduler,
    metrics: ServerMetrics,
    metrics_page: Callable[[], Awaitable[bytes]] | None = None,
) -> None:
    """/health, /metrics (Prometheus: metrics_page's text, else this server's own) and /v1/models."""
    created = int(time.time())

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model, "running": scheduler.running, "queued": scheduler.queued}

    @app.get("/metrics")
    async def prometheus() -> Response:
        page = await metrics_page() if metrics_page else metrics.render()
        return Response(page, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": created, "owned_by": "quickdraft"}],
        }


def add_openai_routes(app: FastAPI, admission: Admission, answers: Answers) -> None:
    """/v1/completions and /v1/chat/completions."""

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await answers.answer(body, await admission.completion_prompt(body), chat=False, request=request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await answers.answer(body, await admission.chat_prompt(body), chat=True, request=request)


def add_quickdraft_routes(app: FastAPI, admission: Admission, answers: Answers) -> None:
    """/v1/quickdraft/info and /v1/quickdraft/steps: what the playground shows."""
    decoder = admission.decoder

    @app.get("/v1/quickdraft/info")
    async def info() -> dict:
        """What the playground offers: the model, the methods, and the settings fixed at start."""
        return {
            "model": admission.model,
            "method": decoder.method,
            "k": decoder.k,
            "methods": list(METHODS),
            "backend": decoder.backend_kind,
            "precision": decoder.precision,
            "device": str(decoder.device),
            "max_tokens_limit": admission.max_tokens_limit,
            "draft_model": decoder.draft is not None,
        }

    @app.post("/v1/quickdraft/steps")
    async def steps(body: ChatCompletionRequest, request: Request) -> Response:
        """A chat request answered as a stream of its target passes (the playground's view): an SSE
        `step` event per pass with the step's record, then `done` with the text and the stats."""
        return await answers.answer(body, await admission.chat_prompt(body), chat=True, request=request, steps=True)


def add_playground_routes(app: FastAPI) -> None:
    """The playground page at / and its script and style sheet."""

    @app.get("/")
    async def playground() -> Response:
        return FileResponse(PLAYGROUND / "playground.html", media_type="text/html")

    @app.get("/playground/{name}")
    async def playground_file(name: str) -> Response:
        if name not in PLAYGROUND_FILES:
            raise ApiError(404, f"no such file: {name}", kind="not_found_error")
        return FileResponse(PLAYGROUND / name, media_type=PLAYGROUND_FILES[name])
