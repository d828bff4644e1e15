"""The one free-port helper of the tests: a TCP port nothing listens on right now."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out on ``host`` and took back.

    Another program may take it before the caller binds it; callers use it at once.
    """
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
