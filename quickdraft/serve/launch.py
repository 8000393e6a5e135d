"""What one server is made of, declared once for `quickdraft serve` and for every Ray Serve replica:
its settings, the model it loads, and the app over that model."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from quickdraft.decoder import Decoder
from quickdraft.errors import QuickdraftError
from quickdraft.serve.app import MAX_BODY_BYTES, create_app
from quickdraft.serve.background import in_passing_thread
from quickdraft.serve.connections import BODY_SECONDS, HEADER_SECONDS, PER_CLIENT, ConnectionLimits
from quickdraft.serve.gate import LOOPBACK_HOSTS


@dataclass(frozen=True)
class ServerSettings:
    """A server's model and bounds (create_app's arguments, plus what to load): checked when made,
    so a replica never starts on settings the command line would have refused."""

    target: str | None = None  # None: the embedded default target
    draft: str | None = None
    method: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # method options, as quickdraft.load takes them
    model_name: str | None = None
    max_batch: int = 8
    max_queue: int = 64
    max_tokens_limit: int = 2048
    drain_seconds: float = 30.0
    header_seconds: float = HEADER_SECONDS
    body_seconds: float = BODY_SECONDS
    max_connections_per_client: int = PER_CLIENT
    max_body_bytes: int = MAX_BODY_BYTES
    api_key: str | tuple[str, ...] | None = None  # one key or several (None: open)
    share_across_keys: bool = False  # suffix decoding drafts from every key's earlier outputs
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS
    threads: int | None = None  # torch threads (None: torch's default)

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_queue", "max_tokens_limit", "max_body_bytes", "max_connections_per_client"):
            if getattr(self, name) < 1:
                raise QuickdraftError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.drain_seconds < 0:
            raise QuickdraftError(f"--drain-seconds must be >= 0, got {self.drain_seconds}")
        for name in ("header_seconds", "body_seconds"):
            if not getattr(self, name) > 0:
                raise QuickdraftError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise QuickdraftError(f"--threads must be >= 1, got {self.threads}")

    @property
    def connection_limits(self) -> ConnectionLimits:
        """What the HTTP server bounds per connection (the body's time is the app's gate's)."""
        return ConnectionLimits(self.header_seconds, self.max_connections_per_client)


def load_decoder(settings: ServerSettings) -> Decoder:
    """The server's decoder, loaded and warmed up (one-time checks and timings now, not in the first
    request), in a thread that ends with the load (background.in_passing_thread says why)."""
    import quickdraft

    def load() -> Decoder:
        loaded = quickdraft.load(settings.target, settings.draft, settings.method, **settings.options)
        loaded.warm_up()
        return loaded

    return in_passing_thread(load)


def server_app(
    settings: ServerSettings, decoder: Decoder, metrics_page: Callable[[], Awaitable[bytes]] | None = None
) -> FastAPI:
    """The app over `decoder` with `settings`' bounds; metrics_page: what /metrics shows (None: this
    server's own metrics)."""
    return create_app(
        decoder,
        settings.model_name,
        settings.max_batch,
        settings.max_queue,
        settings.max_tokens_limit,
        settings.drain_seconds,
        settings.max_body_bytes,
        settings.api_key or None,
        settings.allowed_hosts,
        metrics_page,
        settings.body_seconds,
        settings.share_across_keys,
    )
