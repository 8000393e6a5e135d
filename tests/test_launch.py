"""A server's settings are checked when made, and give the HTTP server its connection limits."""

from __future__ import annotations

import pytest

from quickdraft.errors import QuickdraftError
from quickdraft.serve.connections import ConnectionLimits
from quickdraft.serve.launch import ServerSettings


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"threads": 0}, "--threads must be >= 1"),
        ({"header_seconds": 0}, "--header-seconds must be > 0"),
        ({"body_seconds": -1}, "--body-seconds must be > 0"),
        ({"max_connections_per_client": 0}, "--max-connections-per-client must be >= 1"),
    ],
)
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(QuickdraftError, match=message):
        ServerSettings(**settings)


def test_connection_limits_come_from_the_settings():
    settings = ServerSettings(header_seconds=2.5, max_connections_per_client=3, threads=2)
    assert settings.connection_limits == ConnectionLimits(header_seconds=2.5, per_client=3)
