"""Answering a request: its Job (admission.py) submitted to the scheduler (429 when the queue is
full, 503 when the server is stopping), then its events read into the form the request asked for."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from quickdraft.serve.admission import Admission
from quickdraft.serve.api_errors import ApiError
from quickdraft.serve.events import ClientGone, JobEvents
from quickdraft.serve.forms import JsonAnswer, OpenAIStream, StepsStream
from quickdraft.serve.metrics import ServerMetrics
from quickdraft.serve.protocol import SamplingRequest, new_id
from quickdraft.serve.scheduler import QueueFull, Scheduler, ShuttingDown


class Answers:
    """Submits `admission`'s jobs to `scheduler` and writes their answers, counted in `metrics`."""

    def __init__(self, admission: Admission, scheduler: Scheduler, metrics: ServerMetrics) -> None:
        self.admission, self.scheduler, self.metrics = admission, scheduler, metrics

    async def answer(
        self, body: SamplingRequest, prompt_ids: list[int], chat: bool, request: Request, steps: bool = False
    ) -> Response:
        """The answer to `body` on `prompt_ids`: OpenAI's JSON or SSE stream (body.stream), or with
        `steps` the playground's stream of target passes."""
        events = JobEvents(self.metrics, request.scope["route"].path, every_step=steps, stream=body.stream)
        job = self.admission.job(body, prompt_ids, chat, events, request.scope.get("state", {}).get("tenant"))
        try:
            self.scheduler.submit(job)
        except QueueFull as error:
            raise ApiError(429, str(error), kind="rate_limit_error", headers={"Retry-After": "1"}) from error
        except ShuttingDown as error:
            raise ApiError(503, str(error), kind="server_error") from error
        self.metrics.prompt_tokens.inc(len(prompt_ids))
        decoder, model = self.admission.decoder, self.admission.model
        request_id = new_id("chatcmpl" if chat else "cmpl")
        if steps:
            form = StepsStream(decoder)
        elif body.stream:
            form = OpenAIStream(decoder, request_id, model, chat, body.include_usage())
        else:
            return await self._whole(events, JsonAnswer(decoder, request_id, model, chat, len(prompt_ids)), request)
        self.metrics.answered(request, 200)
        return StreamingResponse(events.pieces(form), media_type="text/event-stream")

    async def _whole(self, events: JobEvents, form: JsonAnswer, request: Request) -> Response:
        """The answer not streamed: written when the job is done; a 499 if its client left first."""
        try:
            [response] = [piece async for piece in events.pieces(form, hangup=request)]
        except ClientGone:
            return Response(status_code=499)
        self.metrics.answered(request, 200)
        return response
