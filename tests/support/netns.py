"""Other hosts on this machine: network namespaces (``ip netns``, as root) joined to ours by
a veth pair, with link-local addresses (nothing leaves the machine).

``hosts(count, subnet)`` makes them and removes them after: host ``i`` is namespace
``lq<tag>h<i>``, reaches us at ``169.254.<subnet + i>.1`` (its ``gateway``, where the test
listens, e.g. with a ``FaultProxy(listen_host=gateway)``) and is ``.2`` itself. A process
runs there under ``host.wrapper`` (``ip netns exec NS``); ``cut()`` / ``heal()`` take our
end of its link down and up (the whole host is cut off). Pick a ``subnet`` no other test
that may run at the same time uses.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from tests.support.requires import missing


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@dataclass
class Host:
    netns: str
    link: str  # our end of its veth pair: down = the host is cut off
    gateway: str  # our address as the host sees it
    address: str  # the host's own

    @property
    def wrapper(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.netns)

    def cut(self) -> None:
        ip("link", "set", self.link, "down")

    def heal(self) -> None:
        ip("link", "set", self.link, "up")


@contextlib.contextmanager
def hosts(count: int, subnet: int = 231) -> Iterator[list[Host]]:
    tag = secrets.token_hex(2)
    made: list[Host] = []
    try:
        for i in range(count):
            netns, ours, theirs = f"lq{tag}h{i}", f"lq{tag}o{i}", f"lq{tag}t{i}"
            gateway, address = f"169.254.{subnet + i}.1", f"169.254.{subnet + i}.2"
            try:
                ip("netns", "add", netns)
            except (subprocess.CalledProcessError, FileNotFoundError) as exc:
                missing(f"network namespaces not permitted here: {exc}")
            made.append(Host(netns, ours, gateway, address))
            ip("link", "add", ours, "type", "veth", "peer", "name", theirs)
            ip("link", "set", theirs, "netns", netns)
            ip("addr", "add", f"{gateway}/30", "dev", ours)
            ip("link", "set", ours, "up")
            ip("netns", "exec", netns, "ip", "addr", "add", f"{address}/30", "dev", theirs)
            ip("netns", "exec", netns, "ip", "link", "set", theirs, "up")
            ip("netns", "exec", netns, "ip", "link", "set", "lo", "up")
        yield made
    finally:
        for host in made:
            subprocess.run(["ip", "link", "del", host.link], capture_output=True, timeout=10)
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, timeout=10)
