"""What every HTTP request passes before the app sees it: the Host header, the API key, the body's size and time.

A plain ASGI middleware, so a refused request costs nothing: a body over the limit is refused
from its Content-Length, or as soon as the bytes received pass the limit (chunked uploads), and
is never held whole in memory. Refusals are OpenAI-shaped JSON like every other error.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable, Sequence

from quickdraft.serve.connections import BODY_SECONDS
from quickdraft.serve.protocol import error_body

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# Answered without an API key: probes, and the playground's static files (the page asks for the key).
OPEN_PATHS = ("/health", "/", "/playground/playground.js", "/playground/playground.css")


def allowed_hosts(bound: str, extra: list[str] = ()) -> tuple[str, ...] | None:
    """The Host names a server bound to `bound` answers to: any for a wildcard address (the
    operator chose to be reachable by every name), else that address, the loopback names when
    it is a loopback one, and `extra` (e.g. a proxy's name)."""
    if bound in ("0.0.0.0", "::", ""):
        return None
    names = [host_name(bound), *(host_name(name) for name in extra)]
    if names[0] in LOOPBACK_HOSTS or names[0].startswith("127."):
        names += LOOPBACK_HOSTS
    return tuple(dict.fromkeys(names))


def api_keys(given: str | Sequence[str] | None) -> tuple[str, ...]:
    """The keys a server accepts, from one key, several, or none (open)."""
    if given is None:
        return ()
    keys = (given,) if isinstance(given, str) else tuple(given)
    if any(not key for key in keys):
        raise ValueError("an API key must not be empty")
    return tuple(dict.fromkeys(keys))


def tenant_of(key: str) -> str:
    """Who a request is for drafters that learn across requests: a digest of its API key (the key
    itself is kept nowhere but the gate)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def host_name(header: str) -> str:
    """The name part of a Host header: "[::1]:8000" -> "::1", "Example.com:80" -> "example.com"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Gate:
    """Refuses, before the app runs: a Host not in `allowed_hosts` (400: closes DNS rebinding;
    None allows any), a bearer key that is missing or not one of `api_key` when keys are set (401,
    except OPEN_PATHS), a body over `max_body_bytes` (413), and a body not all in within
    `body_seconds` (408). on_refused(status) counts each refusal. A request that passes carries
    its tenant in scope["state"]["tenant"]: its key's digest (tenant_of), or None where the server
    is open or `shared_tenant` (drafters then learn from every request alike)."""

    def __init__(
        self,
        app: Callable,
        max_body_bytes: int,
        api_key: str | Sequence[str] | None = None,
        allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS,
        on_refused: Callable[[int], None] = lambda status: None,
        body_seconds: float = BODY_SECONDS,
        shared_tenant: bool = False,
    ) -> None:
        self.app, self.max_body_bytes, self.keys = app, max_body_bytes, api_keys(api_key)
        self.shared_tenant = shared_tenant
        self.body_seconds = body_seconds
        self.allowed_hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        key = self._key(headers)
        refusal = self._refusal(scope, headers, key)
        if refusal is None and int(headers.get("content-length", "0") or 0) > self.max_body_bytes:
            refusal = self._too_large()
        if refusal is None:
            body, refusal = await self._read_body(receive)
        if refusal is not None:
            self.on_refused(refusal[0])
            await _respond(send, *refusal)
            return
        scope.setdefault("state", {})["tenant"] = None if key is None or self.shared_tenant else tenant_of(key)
        await self.app(scope, _replay(body, receive), send)

    def _key(self, headers: dict[str, str]) -> str | None:
        """The accepted key the request carries (None: none, or not one of ours)."""
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        given_bytes = given.strip().encode()
        # Every key is compared, whichever matches: the time taken tells nothing of which.
        matched = [key for key in self.keys if secrets.compare_digest(given_bytes, key.encode())]
        return matched[0] if matched else None

    def _refusal(self, scope: Scope, headers: dict[str, str], key: str | None) -> tuple[int, dict, dict] | None:
        # No Host at all (HTTP/1.0) cannot be DNS rebinding: a browser always names the host it thinks it reaches.
        if (
            self.allowed_hosts is not None
            and "host" in headers
            and host_name(headers["host"]) not in self.allowed_hosts
        ):
            return (
                400,
                error_body(
                    f"the Host header {headers.get('host', '')!r} is not one this server answers to",
                    code="invalid_host",
                ),
                {},
            )
        if self.keys and scope["path"] not in OPEN_PATHS:
            if key is None:
                return (
                    401,
                    error_body(
                        "missing or incorrect API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
                    ),
                    {"www-authenticate": "Bearer"},
                )
        return None

    def _too_large(self) -> tuple[int, dict, dict]:
        return (
            413,
            error_body(
                f"the request body is over this server's limit of {self.max_body_bytes} bytes", code="request_too_large"
            ),
            {},
        )

    async def _read_body(self, receive: Receive) -> tuple[bytes, tuple | None]:
        """The whole body, or a refusal as soon as it passes the size limit or its time is up (one
        deadline for the whole body: a client trickling a byte at a time cannot hold it open)."""
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + self.body_seconds
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except asyncio.TimeoutError:
                return b"", (
                    408,
                    error_body(
                        f"the request body did not arrive within {self.body_seconds:g} s", code="request_timeout"
                    ),
                    {"connection": "close"},
                )
            if message["type"] != "http.request":
                return b"", None  # the client left: the app sees an empty body and then the disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return b"", self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the app the body read here, then the client's later messages (disconnect)."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _respond(send: Send, status: int, body: dict, headers: dict[str, str]) -> None:
    payload = json.dumps(body).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *((key.encode(), value.encode()) for key, value in headers.items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
