"""The HTTP server: OpenAI's /v1/completions and /v1/chat/completions over the batch scheduler."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from quickdraft.decoder import Decoder, GenerationOutput
from quickdraft.errors import QuickdraftError
from quickdraft.memory import loaded_memory
from quickdraft.methods import METHODS, configure
from quickdraft.options import MODEL_OPTIONS
from quickdraft.sampling import TokenLogprob
from quickdraft.serve.gate import LOOPBACK_HOSTS, Gate
from quickdraft.serve.metrics import ServerMetrics
from quickdraft.serve.protocol import (
    FINISH_REASONS,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingRequest,
    chunk_body,
    completion_body,
    error_body,
    logprobs_body,
    new_id,
    usage,
)
from quickdraft.serve.scheduler import Job, QueueFull, Scheduler, ShuttingDown
from quickdraft.stats import StepRecord

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_BODY_BYTES = 2 << 20  # a context's worth of text or token ids is far less
DISCONNECT_POLL_SECONDS = 0.2  # how often a non-streaming request checks that its client is still there
PLAYGROUND = Path(__file__).parent / "static"  # the playground page: no build step, no CDN
PLAYGROUND_FILES = {"playground.js": "text/javascript", "playground.css": "text/css"}


class ApiError(Exception):
    """An OpenAI-style error answer: status code, message, type, param."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.kind, self.param, self.code), status_code=self.status,
                            headers=self.headers)


def create_app(decoder: Decoder, model_name: str | None = None, max_batch: int = 8, max_queue: int = 64,
               max_tokens_limit: int = 2048, drain_seconds: float = 30.0, max_body_bytes: int = MAX_BODY_BYTES,
               api_key: str | None = None, allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS) -> FastAPI:
    """A FastAPI app serving `decoder`'s target under `model_name` (default: its name).

    max_batch: sequences decoded together; max_queue: requests waiting beyond those (then 429);
    max_tokens_limit: the largest max_tokens a request may ask for; drain_seconds: how long a
    shutdown lets running requests finish (then they end with a 503); max_body_bytes: larger
    bodies get a 413; api_key: required as a bearer token (None: open); allowed_hosts: the Host
    names answered (None: any; the default suits a server bound to the loopback address)."""
    name = model_name or decoder.target.name
    metrics = ServerMetrics()
    metrics.record_memory(loaded_memory(decoder, max_batch))
    scheduler = Scheduler(decoder, max_batch, max_queue, metrics)
    created = int(time.time())
    # Every token spells at most this many characters, so a longer text is over the context
    # without tokenizing it.
    max_prompt_chars = decoder.context_length * _longest_token(decoder)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        yield
        await asyncio.to_thread(scheduler.stop, drain_seconds)

    app = FastAPI(title="quickdraft", lifespan=lifespan)
    app.state.scheduler, app.state.metrics, app.state.drain_seconds = scheduler, metrics, drain_seconds
    app.add_middleware(Gate, max_body_bytes=max_body_bytes, api_key=api_key, allowed_hosts=allowed_hosts,
                       on_refused=lambda status: metrics.requests.labels("gate", str(status)).inc())

    def count(request: Request, status: int) -> None:
        """Count an answer under its route template (never the raw path: labels stay bounded)."""
        route = request.scope.get("route")
        metrics.requests.labels(getattr(route, "path", "unmatched"), str(status)).inc()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        first = _most_specific(error.errors())
        where = ".".join(str(part) for part in first.get("loc", ())[1:] if "[" not in str(part)) or None
        message = "request body is not valid JSON" if first.get("type") == "json_invalid" else (
            f"{where or 'body'}: {first.get('msg', 'invalid value')}")
        count(request, 400)
        return ApiError(400, message, param=where).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        count(request, error.status_code)
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return ApiError(error.status_code, str(error.detail), kind, headers=error.headers).response()

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        count(request, error.status)
        return error.response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        count(request, 500)
        return ApiError(500, f"internal server error: {type(error).__name__}", "server_error").response()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": name, "running": scheduler.running, "queued": scheduler.queued}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                            "owned_by": "quickdraft"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        prompt = _completion_prompt(body)
        if isinstance(prompt, str) and len(prompt) > max_prompt_chars:
            raise _too_long(f"the prompt ({len(prompt)} characters)", decoder.context_length, "prompt")
        try:  # tokenizing a long prompt takes a while: never on the event loop
            prompt_ids = await asyncio.to_thread(decoder.encode, prompt, False)
        except QuickdraftError as error:
            raise ApiError(400, str(error), param="prompt") from error
        return await answer(body, prompt_ids, chat=False, request=request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await answer(body, await chat_prompt(body), chat=True, request=request)

    @app.get("/v1/quickdraft/info")
    async def info() -> dict:
        """What the playground offers: the model, the methods, and the settings fixed at start."""
        return {"model": name, "method": decoder.method, "k": decoder.k, "methods": list(METHODS),
                "backend": decoder.backend_kind, "precision": decoder.precision, "device": str(decoder.device),
                "max_tokens_limit": max_tokens_limit, "draft_model": decoder.draft is not None}

    @app.post("/v1/quickdraft/steps")
    async def steps(body: ChatCompletionRequest, request: Request) -> Response:
        """A chat request answered as a stream of its target passes (the playground's view): an SSE
        `step` event per pass with the step's record, then `done` with the text and the stats."""
        return await answer(body, await chat_prompt(body), chat=True, request=request, steps=True)

    @app.get("/")
    async def playground() -> Response:
        return FileResponse(PLAYGROUND / "playground.html", media_type="text/html")

    @app.get("/playground/{name}")
    async def playground_file(name: str) -> Response:
        if name not in PLAYGROUND_FILES:
            raise ApiError(404, f"no such file: {name}", kind="not_found_error")
        return FileResponse(PLAYGROUND / name, media_type=PLAYGROUND_FILES[name])

    async def chat_prompt(body: ChatCompletionRequest) -> list[int]:
        """The chat messages checked and tokenized with the target's chat template."""
        problem = next(filter(None, (m.problem() for m in body.messages)), None)
        if problem:
            raise ApiError(400, problem, param="messages")
        if body.top_logprobs_ is not None and not body.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        if sum(len(m["content"]) for m in messages) > max_prompt_chars:
            raise _too_long("the messages", decoder.context_length, "messages")
        try:
            return await asyncio.to_thread(decoder.encode_chat, messages)
        except QuickdraftError as error:
            raise ApiError(400, str(error), param="messages") from error

    def token_logprobs(entries: list[TokenLogprob] | None, chat: bool, offset: int = 0) -> dict | None:
        """The OpenAI logprobs object of some emitted tokens (None when not asked for)."""
        if entries is None:
            return None
        text = decoder.decode
        return logprobs_body([(text([e.token]), e.logprob, [(text([t]), lp) for t, lp in e.top]) for e in entries],
                             chat, offset)

    async def answer(body: SamplingRequest, prompt_ids: list[int], chat: bool, request: Request,
                     steps: bool = False) -> Response:
        endpoint = request.scope["route"].path
        arrived = time.perf_counter()
        job, events = _job(body, prompt_ids, chat, steps)
        try:
            scheduler.submit(job)
        except QueueFull as error:
            raise ApiError(429, str(error), kind="rate_limit_error", headers={"Retry-After": "1"}) from error
        except ShuttingDown as error:
            raise ApiError(503, str(error), kind="server_error") from error
        metrics.prompt_tokens.inc(len(prompt_ids))
        request_id = new_id("chatcmpl" if chat else "cmpl")
        if steps:
            count(request, 200)
            return StreamingResponse(_steps(job, events, endpoint, arrived), media_type="text/event-stream")
        if body.stream:
            count(request, 200)
            return StreamingResponse(_stream(job, events, request_id, body, chat, endpoint, arrived),
                                     media_type="text/event-stream")
        try:
            first, checked = True, time.monotonic()
            while True:
                try:
                    kind, payload = await asyncio.wait_for(events.get(), DISCONNECT_POLL_SECONDS)
                except TimeoutError:
                    kind = None
                if time.monotonic() - checked >= DISCONNECT_POLL_SECONDS:
                    checked = time.monotonic()
                    if await request.is_disconnected():  # nobody will read the answer: free the slot now
                        job.cancelled.set()
                        return Response(status_code=499)
                if kind == "step" and first:
                    metrics.first_token.labels(endpoint).observe(time.perf_counter() - arrived)
                    first = False
                elif kind == "error":
                    message, status = payload
                    raise ApiError(status, message, kind="server_error" if status >= 500 else "invalid_request_error")
                elif kind == "done":
                    break
        finally:
            job.cancelled.set()  # a no-op once finished; frees the slot if the client went away
        output, served_by = payload
        metrics.latency.labels(endpoint).observe(time.perf_counter() - arrived)
        count(request, 200)
        extra = {"usage": usage(len(prompt_ids), len(output.token_ids)), "quickdraft": _stats(output, served_by)}
        return JSONResponse(completion_body(request_id, name, output.text, FINISH_REASONS.get(output.finish_reason),
                                            chat, extra, token_logprobs(output.logprobs, chat)))

    async def _stream(job: Job, events: asyncio.Queue, request_id: str, body: SamplingRequest, chat: bool,
                      endpoint: str, arrived: float) -> AsyncIterator[str]:
        sent = ""  # the scheduler detokenizes incrementally and sends only text that is final
        try:
            if chat:  # OpenAI's first chat chunk announces the role
                yield _sse(chunk_body(request_id, name, "", None, chat, role=True))
            first = True
            while True:
                kind, payload = await events.get()
                if kind == "error":
                    message, status = payload
                    yield _sse(error_body(message, "server_error" if status >= 500 else "invalid_request_error"))
                    break
                if kind == "step":
                    if first:
                        metrics.first_token.labels(endpoint).observe(time.perf_counter() - arrived)
                        first = False
                    text, logprobs = payload
                    if text or logprobs:
                        yield _sse(chunk_body(request_id, name, text, None, chat,
                                              logprobs=token_logprobs(logprobs, chat, len(sent))))
                        sent += text
                    continue
                output, served_by = payload
                piece = output.text[len(sent) :] if output.text.startswith(sent) else ""
                if piece:
                    yield _sse(chunk_body(request_id, name, piece, None, chat))
                yield _sse(chunk_body(request_id, name, None, FINISH_REASONS.get(output.finish_reason), chat,
                                      extra={"quickdraft": _stats(output, served_by)}))
                if body.include_usage():
                    yield _sse(chunk_body(request_id, name, None, None, chat) | {
                        "choices": [], "usage": usage(len(output.prompt_token_ids), len(output.token_ids))})
                metrics.latency.labels(endpoint).observe(time.perf_counter() - arrived)
                break
            yield "data: [DONE]\n\n"
        finally:
            job.cancelled.set()  # client gone mid-stream: the scheduler drops it at the next step

    async def _steps(job: Job, events: asyncio.Queue, endpoint: str, arrived: float) -> AsyncIterator[str]:
        """SSE: `step` per target pass (StepRecord's fields, the tokens' text, the text now final),
        then `done` (the whole text and the stats) or `error`."""
        text = decoder.decode
        try:
            while True:
                kind, payload = await events.get()
                if kind == "error":
                    message, status = payload
                    yield _sse(error_body(message, "server_error" if status >= 500 else "invalid_request_error"),
                               "error")
                    break
                if kind == "step":
                    final, _, record = payload
                    yield _sse({"k": record.k, "draft_tokens": record.draft_tokens,
                                "draft_texts": [text([t]) for t in record.draft_tokens], "accepted": record.accepted,
                                "accepted_texts": [text([t]) for t in record.emitted[: record.accepted]],
                                "next_token": record.next_token, "next_text": text([record.next_token]),
                                "bonus": record.bonus, "emitted": record.emitted, "tree": record.tree_depth is not None,
                                "text": final, "draft_ms": 1000 * record.draft_time,
                                "verify_ms": 1000 * record.verify_time}, "step")
                    continue
                output, served_by = payload
                yield _sse({"text": output.text, "finish_reason": FINISH_REASONS.get(output.finish_reason),
                            "quickdraft": _stats(output, served_by)}, "done")
                metrics.latency.labels(endpoint).observe(time.perf_counter() - arrived)
                break
        finally:
            job.cancelled.set()

    def _job(body: SamplingRequest, prompt_ids: list[int], chat: bool, steps: bool = False) -> tuple[Job, asyncio.Queue]:
        """Validate the request against this server and build its Job with callbacks into a queue."""
        if body.model != name:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server has {name!r}",
                           param="model", code="model_not_found")
        if body.n != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        unsupported = body.unsupported()
        if unsupported:
            raise ApiError(400, f"{unsupported} is not supported by this server", param=unsupported)
        limit = decoder.context_length
        if len(prompt_ids) >= limit:
            raise _too_long(f"the prompt ({len(prompt_ids)} tokens)", limit, "messages" if chat else "prompt")
        requested = body.max_completion_tokens or body.max_tokens
        if requested is None:
            requested = min(max_tokens_limit, limit - len(prompt_ids)) if chat else DEFAULT_COMPLETION_TOKENS
        if requested < 1:
            raise ApiError(400, f"max_tokens must be >= 1, got {requested}", param="max_tokens")
        if requested > max_tokens_limit:
            raise ApiError(400, f"max_tokens {requested} is over this server's limit of {max_tokens_limit}",
                           param="max_tokens")
        if len(prompt_ids) + requested > limit:
            raise ApiError(400, f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({requested}) exceeds "
                                f"the context length of {limit} tokens", param="max_tokens",
                           code="context_length_exceeded")
        method = body.quickdraft.method if body.quickdraft else None
        settings = body.quickdraft.settings() if body.quickdraft else {}
        check_settings(method, settings)
        if any(not stop for stop in body.stops()):
            raise ApiError(400, "stop strings must not be empty", param="stop")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def put(kind: str, payload: object) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, (kind, payload))
            except RuntimeError:  # the event loop is closed (shutdown): nobody is listening any more
                job.cancelled.set()

        options = dict(temperature=body.temperature, top_k=body.top_k,
                       top_p=None if body.top_p >= 1.0 else body.top_p,
                       seed=body.seed if body.seed is not None else secrets.randbits(63), stop=body.stops() or None,
                       logprobs=body.top_logprobs())

        reported = False  # whether a step has been reported yet (its arrival is the time to first token)

        def on_step(record: StepRecord, text: str) -> None:
            # Wake the event loop only when there is news: the first step, then for streams each
            # step that made text or log-probabilities.
            nonlocal reported
            if steps:  # every pass, news or not
                put("step", (text, record.logprobs, record))
            elif not reported or (body.stream and (text or record.logprobs)):
                reported = True
                put("step", (text, record.logprobs))

        job = Job(prompt_ids, requested, options, method, settings, on_step=on_step,
                  on_finish=lambda output, served_by: put("done", (output, served_by)),
                  on_error=lambda message, status: put("error", (message, status)))
        return job, events

    def check_settings(method: str | None, settings: dict) -> None:
        """The request's method and options, checked as the library checks them (400 on a bad one)."""
        if any(name in MODEL_OPTIONS for name in settings):
            name = next(name for name in settings if name in MODEL_OPTIONS)
            raise ApiError(400, f"option {name!r} is set when the server starts, not per request",
                           param=f"quickdraft.{name}")
        base = {} if method is not None else dict(decoder.config.given)
        try:
            configure(method or decoder.method, decoder.draft is not None, **(base | settings))
        except QuickdraftError as error:
            param = f"quickdraft.{error.option}" if error.option else "quickdraft"
            raise ApiError(400, str(error), param=param) from error

    return app


def _completion_prompt(body: CompletionRequest) -> str | list[int]:
    """The completions prompt: one text or one list of token ids."""
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise ApiError(400, "one prompt per request is supported", param="prompt")
        prompt = prompt[0]
    return prompt


def _too_long(what: str, limit: int, param: str) -> ApiError:
    return ApiError(400, f"{what} is longer than the context length of {limit} tokens; shorten it",
                    param=param, code="context_length_exceeded")


def _longest_token(decoder: Decoder) -> int:
    """The most characters one token can spell (its vocabulary string is at least as long)."""
    tokenizer = decoder.tokenizer
    return max((len(piece) for piece in tokenizer.get_vocab()), default=1) if tokenizer is not None else 1 << 20


def _most_specific(errors: list[dict]) -> dict:
    """The validation error to report: the deepest, and a broken constraint before a type mismatch
    (a union field reports one mismatch per alternative it tried)."""
    return min(errors, key=lambda e: (-len(e.get("loc", ())), str(e.get("type", "")).endswith("_type")),
               default={})


def _stats(output: GenerationOutput, served_by: Decoder) -> dict:
    """The request's speculative stats: the `quickdraft` extension field of a response."""
    s = output.stats
    return {"method": served_by.method, "k": served_by.k, "target_passes": s.target_passes,
            "drafted_tokens": s.drafted_tokens, "accepted_tokens": s.accepted_tokens,
            "acceptance_rate": s.acceptance_rate, "mean_accepted_length": s.mean_accepted_tokens,
            "tokens_per_second": s.tokens_per_second, "finish_reason": s.finish_reason}


def _sse(body: dict, event: str | None = None) -> str:
    return (f"event: {event}\n" if event else "") + f"data: {json.dumps(body)}\n\n"
