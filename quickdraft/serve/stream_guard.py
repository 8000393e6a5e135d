"""An event stream cut short ends with an error event: a middleware for Ray Serve's proxy.

When a replica dies in the middle of a streamed answer, Ray's proxy drops what it would say (it
writes nothing once the response has started) and the client sees a cut connection. Installed in
the proxy (`proxy_middlewares`, named by PROXY_ENV), this middleware notes an event-stream response
and, when the app behind it returns or fails before the body's last part, sends the error event
the single server sends for a failed job, so a client learns why (the openai SDK raises APIError
with the message).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.middleware import Middleware

from quickdraft.serve.forms import sse
from quickdraft.serve.protocol import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CUT_SHORT = (
    "the replica serving this stream stopped before the answer was complete (its process ended); "
    "the text so far is a part only: send the request again"
)
# Ray's setting for the proxy's middlewares, passed to Serve's controller (whose proxies inherit it).
PROXY_ENV = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "quickdraft.serve.stream_guard:proxy_middlewares"}


def proxy_middlewares() -> list[Middleware]:
    """What Ray's proxy calls at start (PROXY_ENV names it): the middlewares it wraps itself in."""
    return [Middleware(StreamGuard)]


def closing_event(path: str) -> bytes:
    """The error event (and the end marker, for OpenAI streams) for a stream on `path` that was cut short."""
    body = error_body(CUT_SHORT, "server_error")
    if path.startswith("/v1/quickdraft/"):
        return sse(body, "error").encode()  # quickdraft's own streams name their events
    return (sse(body) + "data: [DONE]\n\n").encode()


class StreamGuard:
    """ASGI middleware: an event-stream response left open by the app behind it gets an error event."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        open_stream = False

        async def watched(message: Message) -> None:
            nonlocal open_stream
            if message["type"] == "http.response.start":
                open_stream = is_event_stream(message.get("headers", []))
            elif message["type"] == "http.response.body":
                open_stream = open_stream and message.get("more_body", False)
            await send(message)

        failure = None
        try:
            await self.app(scope, receive, watched)
        except Exception as error:  # a cancelled task (the client left) is no Exception: nothing to send
            failure = error
        if open_stream:
            await send({"type": "http.response.body", "body": closing_event(scope["path"]), "more_body": False})
        if failure is not None:
            raise failure


def is_event_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name.lower() == b"content-type" and value.startswith(b"text/event-stream") for name, value in headers)
