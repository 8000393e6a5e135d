"""The OpenAI wire format: request bodies (validated by pydantic), responses, chunks and errors."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from quickdraft.option import Option
from quickdraft.settings import OPENAI_DEFAULTS, SAMPLING

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}  # ours -> OpenAI's
MAX_STOPS, MAX_STOP_CHARS = 4, 256  # OpenAI allows 4 stop sequences
MAX_TEMPERATURE = 2.0  # OpenAI's own upper bound (the lower one is declared in settings.py)


def declared(name: str, **field: Any) -> Any:
    """A pydantic Field with the declared sampling setting's bounds and help (settings.py)."""
    option: Option = SAMPLING[name]
    return Field(**field, **option.limits(), description=option.help)


def _valid_unicode(text: str) -> str:
    """JSON can carry lone surrogates ("\\ud800"), which no tokenizer can encode: refuse them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"the text has an unpaired surrogate at character {error.start}") from None
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]
Stop = Annotated[str, Field(max_length=MAX_STOP_CHARS), AfterValidator(_valid_unicode)]

# OpenAI fields this server does not implement -> whether a value asks for nothing (then it is
# accepted and has no effect); any other value is refused with a 400 that names the field.
UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "presence_penalty": lambda v: v in (None, 0),
    "frequency_penalty": lambda v: v in (None, 0),
    "repetition_penalty": lambda v: v in (None, 1),
    "logit_bias": lambda v: not v,
    "tools": lambda v: not v,
    "tool_choice": lambda v: v in (None, "none", "auto"),
    "functions": lambda v: not v,
    "function_call": lambda v: v in (None, "none", "auto"),
    "response_format": lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
    "best_of": lambda v: v in (None, 1),
    "suffix": lambda v: not v,
    "echo": lambda v: not v,
    "modalities": lambda v: v in (None, ["text"]),
    "audio": lambda v: v is None,
    "prediction": lambda v: v is None,
    "web_search_options": lambda v: v is None,
}


class QuickdraftOptions(BaseModel):
    """The `quickdraft` extension object: how this request is drafted. `method` is a name or a
    METHOD:key=value spec; any other key is an option of quickdraft.options.OPTIONS (k, max_ngram,
    tree_nodes, ...), checked by the same declaration as the CLI's and the library's."""

    model_config = ConfigDict(extra="allow")
    method: str | None = None

    def settings(self) -> dict:
        return dict(self.model_extra or {})


class SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions. Unknown fields are kept (extra) so that
    unsupported OpenAI features are refused rather than silently ignored (see UNSUPPORTED)."""

    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # the chat API's newer name for max_tokens
    temperature: float = declared("temperature", default=OPENAI_DEFAULTS["temperature"], le=MAX_TEMPERATURE)
    top_p: float = declared("top_p", default=OPENAI_DEFAULTS["top_p"])
    top_k: int | None = declared("top_k", default=None)
    stop: Stop | Annotated[list[Stop], Field(max_length=MAX_STOPS)] | None = None
    seed: int | None = declared("seed", default=OPENAI_DEFAULTS["seed"])
    n: int = 1
    stream: bool = False
    stream_options: dict | None = None
    quickdraft: QuickdraftOptions | None = None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    def unsupported(self) -> str | None:
        """The first field that asks for a feature this server lacks, or None."""
        extra = self.model_extra or {}
        return next(
            (name for name, harmless in UNSUPPORTED.items() if name in extra and not harmless(extra[name])), None
        )

    def top_logprobs(self) -> int | None:
        """How many alternatives to report per token; None: no logprobs."""
        raise NotImplementedError


class CompletionRequest(SamplingRequest):
    prompt: Text | list[int] | list[Text] | list[list[int]]
    logprobs: int | None = declared("logprobs", default=None)  # the legacy API: a count

    def top_logprobs(self) -> int | None:
        return self.logprobs


class ContentPart(BaseModel):
    """One part of a message's content; only text parts are supported."""

    type: str
    text: Text | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Text | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content)
        return self.content or ""

    def problem(self) -> str | None:
        """Why this message's content cannot be used, or None."""
        for part in self.content if isinstance(self.content, list) else []:
            if part.type != "text":
                return f"content parts of type {part.type!r} are not supported (only 'text')"
            if part.text is None:
                return "a text content part needs a 'text' string"
        return None


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs_: int | None = declared("logprobs", default=None, alias="top_logprobs")

    def top_logprobs(self) -> int | None:
        return (self.top_logprobs_ or 0) if self.logprobs else None


def error_body(
    message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def logprobs_body(entries: list[tuple[str, float, list[tuple[str, float]]]], chat: bool, offset: int = 0) -> dict:
    """OpenAI's logprobs object for tokens given as (text, logprob, [(alternative, logprob), ...]);
    offset: where the first token's text starts in the choice's text (the completions API's form)."""
    if chat:

        def entry(text: str, logprob: float) -> dict:
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        return {
            "content": [entry(t, lp) | {"top_logprobs": [entry(a, alp) for a, alp in top]} for t, lp, top in entries],
            "refusal": None,
        }
    offsets = []
    for text, _, _ in entries:
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": [t for t, _, _ in entries],
        "token_logprobs": [lp for _, lp, _ in entries],
        "top_logprobs": [dict(top) for _, _, top in entries],
        "text_offset": offsets,
    }


def completion_body(
    request_id: str,
    model: str,
    text: str,
    finish: str | None,
    chat: bool,
    extra: dict | None = None,
    logprobs: dict | None = None,
) -> dict:
    """A whole response (chunk=False) with one choice."""
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": logprobs,
        }
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}
    return {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    } | (extra or {})


def chunk_body(
    request_id: str,
    model: str,
    text: str | None,
    finish: str | None,
    chat: bool,
    role: bool = False,
    extra: dict | None = None,
    logprobs: dict | None = None,
) -> dict:
    """One streamed chunk; text None means an empty delta (the final or usage chunk)."""
    if chat:
        delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text is not None else {})
        choices = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]
    else:
        choices = [{"index": 0, "text": text or "", "finish_reason": finish, "logprobs": logprobs}]
    return {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    } | (extra or {})
