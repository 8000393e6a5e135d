"""The forms an answer takes, piece by piece, as events.JobEvents reads its job's events: OpenAI's
whole JSON answer, OpenAI's SSE stream, and the playground's stream of target passes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NoReturn

from fastapi.responses import JSONResponse

from quickdraft.decoder import Decoder, GenerationOutput
from quickdraft.sampling import TokenLogprob
from quickdraft.serve.api_errors import ApiError
from quickdraft.serve.protocol import FINISH_REASONS, chunk_body, completion_body, logprobs_body, usage
from quickdraft.stats import StepRecord


class Form:
    """How an answer is written: the pieces it opens with, sends for a step, at the end, on an error,
    and closes with. Each form says how it ends and fails; by default it writes nothing else."""

    timed_first_token = True  # whether its first step is observed as the request's first token

    def opening(self) -> list[Any]:
        return []

    def step(self, payload: tuple) -> list[Any]:
        return []

    def done(self, output: GenerationOutput, served_by: Decoder) -> list[Any]:
        raise NotImplementedError

    def error(self, error: ApiError) -> list[Any]:
        raise NotImplementedError

    def closing(self) -> list[Any]:
        return []


@dataclass
class JsonAnswer(Form):
    """OpenAI's whole answer: one JSONResponse at the end; an error is raised for the error handlers."""

    decoder: Decoder
    request_id: str
    model: str
    chat: bool
    prompt_tokens: int

    def done(self, output: GenerationOutput, served_by: Decoder) -> list[JSONResponse]:
        extra = {"usage": usage(self.prompt_tokens, len(output.token_ids)), "quickdraft": stats(output, served_by)}
        return [
            JSONResponse(
                completion_body(
                    self.request_id,
                    self.model,
                    output.text,
                    FINISH_REASONS.get(output.finish_reason),
                    self.chat,
                    extra,
                    token_logprobs(self.decoder, output.logprobs, self.chat),
                )
            )
        ]

    def error(self, error: ApiError) -> NoReturn:
        raise error


@dataclass
class OpenAIStream(Form):
    """OpenAI's SSE stream: a chunk per step with text, the rest of the text, the finish, the usage if
    asked for, then [DONE]; an error is a chunk of its own before [DONE]."""

    decoder: Decoder
    request_id: str
    model: str
    chat: bool
    include_usage: bool
    sent: str = ""  # the scheduler detokenizes incrementally and sends only text that is final

    def _chunk(self, text: str | None, finish: str | None = None, **fields: Any) -> str:
        return sse(chunk_body(self.request_id, self.model, text, finish, self.chat, **fields))

    def opening(self) -> list[str]:
        return [self._chunk("", role=True)] if self.chat else []  # OpenAI's first chat chunk announces the role

    def step(self, payload: tuple[str, list[TokenLogprob] | None]) -> list[str]:
        text, logprobs = payload
        if not (text or logprobs):
            return []
        chunk = self._chunk(text, logprobs=token_logprobs(self.decoder, logprobs, self.chat, len(self.sent)))
        self.sent += text
        return [chunk]

    def done(self, output: GenerationOutput, served_by: Decoder) -> list[str]:
        rest = output.text[len(self.sent) :] if output.text.startswith(self.sent) else ""
        chunks = [self._chunk(rest)] if rest else []
        chunks.append(
            self._chunk(None, FINISH_REASONS.get(output.finish_reason), extra={"quickdraft": stats(output, served_by)})
        )
        if self.include_usage:
            chunks.append(
                sse(
                    chunk_body(self.request_id, self.model, None, None, self.chat)
                    | {"choices": [], "usage": usage(len(output.prompt_token_ids), len(output.token_ids))}
                )
            )
        return chunks

    def error(self, error: ApiError) -> list[str]:
        return [sse(error.body())]

    def closing(self) -> list[str]:
        return ["data: [DONE]\n\n"]


@dataclass
class StepsStream(Form):
    """The playground's view, in SSE: `step` per target pass (StepRecord's fields, the tokens' text,
    the text now final), then `done` (the whole text and the stats) or `error`."""

    decoder: Decoder
    timed_first_token = False  # the time-to-first-token histogram counts OpenAI's answers only

    def step(self, payload: tuple[str, list[TokenLogprob] | None, StepRecord]) -> list[str]:
        final, _, record = payload
        text = self.decoder.decode
        return [
            sse(
                {
                    "k": record.k,
                    "draft_tokens": record.draft_tokens,
                    "draft_texts": [text([t]) for t in record.draft_tokens],
                    "accepted": record.accepted,
                    "accepted_texts": [text([t]) for t in record.emitted[: record.accepted]],
                    "next_token": record.next_token,
                    "next_text": text([record.next_token]),
                    "bonus": record.bonus,
                    "emitted": record.emitted,
                    "tree": record.tree_depth is not None,
                    "text": final,
                    "draft_ms": 1000 * record.draft_time,
                    "verify_ms": 1000 * record.verify_time,
                },
                "step",
            )
        ]

    def done(self, output: GenerationOutput, served_by: Decoder) -> list[str]:
        return [
            sse(
                {
                    "text": output.text,
                    "finish_reason": FINISH_REASONS.get(output.finish_reason),
                    "quickdraft": stats(output, served_by),
                },
                "done",
            )
        ]

    def error(self, error: ApiError) -> list[str]:
        return [sse(error.body(), "error")]


def token_logprobs(decoder: Decoder, entries: list[TokenLogprob] | None, chat: bool, offset: int = 0) -> dict | None:
    """The OpenAI logprobs object of some emitted tokens (None when not asked for)."""
    if entries is None:
        return None
    text = decoder.decode
    return logprobs_body(
        [(text([e.token]), e.logprob, [(text([t]), lp) for t, lp in e.top]) for e in entries], chat, offset
    )


def stats(output: GenerationOutput, served_by: Decoder) -> dict:
    """The request's speculative stats: the `quickdraft` extension field of a response."""
    s = output.stats
    return {
        "method": served_by.method,
        "k": served_by.k,
        "target_passes": s.target_passes,
        "drafted_tokens": s.drafted_tokens,
        "accepted_tokens": s.accepted_tokens,
        "acceptance_rate": s.acceptance_rate,
        "mean_accepted_length": s.mean_accepted_tokens,
        "tokens_per_second": s.tokens_per_second,
        "finish_reason": s.finish_reason,
    }


def sse(body: dict, event: str | None = None) -> str:
    return (f"event: {event}\n" if event else "") + f"data: {json.dumps(body)}\n\n"
