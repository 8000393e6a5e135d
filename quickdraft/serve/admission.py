"""A request checked against this server before it is decoded: its prompt tokenized (off the event
loop), its fields, lengths and drafting settings checked, its Job built. A refusal is an ApiError."""

from __future__ import annotations

import asyncio
import secrets

from quickdraft.decoder import Decoder
from quickdraft.errors import QuickdraftError
from quickdraft.methods import configure
from quickdraft.options import MODEL_OPTIONS
from quickdraft.serve.api_errors import ApiError, too_long
from quickdraft.serve.events import JobEvents
from quickdraft.serve.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from quickdraft.serve.scheduler import Job

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for /v1/completions


class Admission:
    """The checks of `decoder`'s server, served as `model`, whose requests ask for at most
    `max_tokens_limit` new tokens."""

    def __init__(self, decoder: Decoder, model: str, max_tokens_limit: int) -> None:
        self.decoder, self.model, self.max_tokens_limit = decoder, model, max_tokens_limit
        # Every token spells at most this many characters, so a longer text is over the context
        # without tokenizing it.
        self.max_prompt_chars = decoder.context_length * _longest_token(decoder)

    async def completion_prompt(self, body: CompletionRequest) -> list[int]:
        """The completions prompt, one text or one list of token ids, as token ids."""
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise ApiError(400, "one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str) and len(prompt) > self.max_prompt_chars:
            raise too_long(f"the prompt ({len(prompt)} characters)", self.decoder.context_length, "prompt")
        try:  # tokenizing a long prompt takes a while: never on the event loop
            return await asyncio.to_thread(self.decoder.encode, prompt, False)
        except QuickdraftError as error:
            raise ApiError(400, str(error), param="prompt") from error

    async def chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        """The chat messages checked and tokenized with the target's chat template."""
        problem = next(filter(None, (m.problem() for m in body.messages)), None)
        if problem:
            raise ApiError(400, problem, param="messages")
        if body.top_logprobs_ is not None and not body.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        if sum(len(m["content"]) for m in messages) > self.max_prompt_chars:
            raise too_long("the messages", self.decoder.context_length, "messages")
        try:
            return await asyncio.to_thread(self.decoder.encode_chat, messages)
        except QuickdraftError as error:
            raise ApiError(400, str(error), param="messages") from error

    def job(
        self, body: SamplingRequest, prompt_ids: list[int], chat: bool, events: JobEvents, tenant: str | None = None
    ) -> Job:
        """The request's Job, reporting to `events`, once the request passes every check (in this order).
        tenant: whose earlier outputs it may draft from (the gate's, from its API key)."""
        self._check_fields(body)
        requested = self._max_new_tokens(body, len(prompt_ids), chat)
        method = body.quickdraft.method if body.quickdraft else None
        settings = body.quickdraft.settings() if body.quickdraft else {}
        self._check_settings(method, settings)
        if any(not stop for stop in body.stops()):
            raise ApiError(400, "stop strings must not be empty", param="stop")
        options = dict(
            temperature=body.temperature,
            top_k=body.top_k,
            top_p=None if body.top_p >= 1.0 else body.top_p,
            seed=body.seed if body.seed is not None else secrets.randbits(63),
            stop=body.stops() or None,
            logprobs=body.top_logprobs(),
            tenant=tenant,
        )
        return Job(
            prompt_ids,
            requested,
            options,
            method,
            settings,
            on_step=events.on_step,
            on_finish=events.on_finish,
            on_error=events.on_error,
            cancelled=events.cancelled,
        )

    def _check_fields(self, body: SamplingRequest) -> None:
        """The model this server has, one choice, and no feature it lacks."""
        if body.model != self.model:
            raise ApiError(
                404,
                f"the model {body.model!r} does not exist; this server has {self.model!r}",
                param="model",
                code="model_not_found",
            )
        if body.n != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        unsupported = body.unsupported()
        if unsupported:
            raise ApiError(400, f"{unsupported} is not supported by this server", param=unsupported)

    def _max_new_tokens(self, body: SamplingRequest, prompt_tokens: int, chat: bool) -> int:
        """The request's max_tokens (or the default), checked against the limit and the context."""
        limit = self.decoder.context_length
        if prompt_tokens >= limit:
            raise too_long(f"the prompt ({prompt_tokens} tokens)", limit, "messages" if chat else "prompt")
        requested = body.max_completion_tokens or body.max_tokens
        if requested is None:
            requested = min(self.max_tokens_limit, limit - prompt_tokens) if chat else DEFAULT_COMPLETION_TOKENS
        if requested < 1:
            raise ApiError(400, f"max_tokens must be >= 1, got {requested}", param="max_tokens")
        if requested > self.max_tokens_limit:
            raise ApiError(
                400,
                f"max_tokens {requested} is over this server's limit of {self.max_tokens_limit}",
                param="max_tokens",
            )
        if prompt_tokens + requested > limit:
            raise ApiError(
                400,
                f"the prompt ({prompt_tokens} tokens) plus max_tokens ({requested}) exceeds "
                f"the context length of {limit} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return requested

    def _check_settings(self, method: str | None, settings: dict) -> None:
        """The request's method and options, checked as the library checks them (400 on a bad one)."""
        if any(name in MODEL_OPTIONS for name in settings):
            name = next(name for name in settings if name in MODEL_OPTIONS)
            raise ApiError(
                400, f"option {name!r} is set when the server starts, not per request", param=f"quickdraft.{name}"
            )
        decoder = self.decoder
        base = {} if method is not None else dict(decoder.config.given)
        try:
            configure(method or decoder.method, decoder.draft is not None, **(base | settings))
        except QuickdraftError as error:
            param = f"quickdraft.{error.option}" if error.option else "quickdraft"
            raise ApiError(400, str(error), param=param) from error


def _longest_token(decoder: Decoder) -> int:
    """The most characters one token can spell (its vocabulary string is at least as long)."""
    tokenizer = decoder.tokenizer
    return max((len(piece) for piece in tokenizer.get_vocab()), default=1) if tokenizer is not None else 1 << 20
