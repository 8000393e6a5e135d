"""The proxy middleware: an event stream cut short gets the error event; whole answers pass untouched."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from quickdraft.serve.stream_guard import CUT_SHORT, StreamGuard, closing_event, proxy_middlewares

CHUNK = b'data: {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "Hi"}]}\n\n'


def app_that(ends: str, content_type: bytes = b"text/event-stream"):
    """An ASGI app that starts a response, sends one part, then ends as `ends` says."""

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
        await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
        if ends == "raises":
            raise RuntimeError("the replica died")
        if ends == "completes":
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    return app


def sent_by(app, path: str = "/v1/completions") -> list[dict]:
    messages = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        messages.append(message)

    async def run():
        try:
            await StreamGuard(app)({"type": "http", "path": path}, receive, send)
        except RuntimeError:
            pass  # re-raised after the error event: the proxy logs it

    asyncio.run(run())
    return messages


@pytest.mark.parametrize("ends", ["raises", "returns"])
def test_a_stream_cut_short_ends_with_the_error_event(ends):
    messages = sent_by(app_that(ends))
    last = messages[-1]
    assert last["type"] == "http.response.body" and last["more_body"] is False
    event, done = last["body"].decode().split("\n\n")[:2]
    assert json.loads(event.removeprefix("data: "))["error"] == {
        "message": CUT_SHORT,
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert done == "data: [DONE]"


def test_a_whole_stream_and_other_answers_pass_untouched():
    assert [m.get("body") for m in sent_by(app_that("completes"))[1:]] == [CHUNK, b"data: [DONE]\n\n"]
    assert len(sent_by(app_that("returns", content_type=b"application/json"))) == 2  # not a stream: left alone


def test_quickdrafts_own_streams_get_a_named_error_event():
    assert closing_event("/v1/quickdraft/steps").decode().startswith("event: error\ndata: ")
    assert b"[DONE]" not in closing_event("/v1/quickdraft/steps")


def test_the_openai_client_raises_the_message():
    """What a user of the official SDK sees: APIError with the reason, not a dropped connection."""
    guarded = StreamGuard(app_that("raises"))

    async def read() -> None:
        transport = httpx.ASGITransport(app=guarded, raise_app_exceptions=False)
        client = openai.AsyncOpenAI(
            base_url="http://proxy/v1", api_key="k", http_client=httpx.AsyncClient(transport=transport)
        )
        async for _ in await client.completions.create(model="m", prompt="p", stream=True):
            pass

    with pytest.raises(openai.APIError, match="stopped before the answer was complete") as raised:
        asyncio.run(read())
    assert not isinstance(raised.value, openai.APIConnectionError)


def test_the_proxy_callback_returns_the_middleware():
    assert [m.cls for m in proxy_middlewares()] == [StreamGuard]
