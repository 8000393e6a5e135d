"""The OpenAI wire format: request bodies (validated by pydantic), responses, chunks and errors."""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}  # ours -> OpenAI's


class QuickdraftOptions(BaseModel):
    """The `quickdraft` extension object: how this request is drafted. `method` is a name or a
    METHOD:key=value spec; any other key is an option of quickdraft.options.OPTIONS (k, max_ngram,
    tree_nodes, ...), checked by the same declaration as the CLI's and the library's."""

    model_config = ConfigDict(extra="allow")
    method: str | None = None

    def settings(self) -> dict:
        return dict(self.model_extra or {})


class SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions (unknown OpenAI fields are ignored)."""

    model: str
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # the chat API's newer name for max_tokens
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: dict | None = None
    quickdraft: QuickdraftOptions | None = None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: keep the text ones
            return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")
        return self.content or ""


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(request_id: str, model: str, text: str, finish: str | None, chat: bool,
                    extra: dict | None = None) -> dict:
    """A whole response (chunk=False) with one choice."""
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                  "logprobs": None}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    return {"id": request_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]} | (extra or {})


def chunk_body(request_id: str, model: str, text: str | None, finish: str | None, chat: bool,
               role: bool = False, extra: dict | None = None) -> dict:
    """One streamed chunk; text None means an empty delta (the final or usage chunk)."""
    if chat:
        delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text is not None else {})
        choices = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    else:
        choices = [{"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}]
    return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices} | (extra or {})
