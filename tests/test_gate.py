"""The request gate's pure parts: which Host names a server answers to."""

import pytest

from quickdraft.serve.gate import LOOPBACK_HOSTS, allowed_hosts, host_name


@pytest.mark.parametrize(
    "header, name",
    [
        ("127.0.0.1:8000", "127.0.0.1"),
        ("[::1]:8000", "::1"),
        ("::1", "::1"),
        ("Example.COM", "example.com"),
        ("localhost:80", "localhost"),
        ("[::1", "[::1"),
    ],
)
def test_host_name_drops_the_port_and_case(header, name):
    assert host_name(header) == name


def test_allowed_hosts_follow_the_bound_address():
    assert allowed_hosts("0.0.0.0") is None and allowed_hosts("::") is None  # reachable by any name, by choice
    assert set(allowed_hosts("127.0.0.1")) == set(LOOPBACK_HOSTS)
    assert set(allowed_hosts("localhost", ["proxy.internal"])) == {*LOOPBACK_HOSTS, "proxy.internal"}
    assert allowed_hosts("10.0.0.5") == ("10.0.0.5",)
