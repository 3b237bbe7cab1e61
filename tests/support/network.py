"""What this machine's network stack offers the tests that listen on more than one address."""

from __future__ import annotations

import socket

__all__ = ["has_ipv6_loopback"]


def has_ipv6_loopback() -> bool:
    """Whether ``::1`` can be bound here: containers and CI runners often have IPv6 turned off."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True
