"""``python -P -m bench.peers pgqueuer|procrastinate setup|drain ...`` (see __init__).

The peer modules are imported from here rather than run as ``__main__`` themselves, so
that they are ordinary importable modules (procrastinate warns about an App created in
``__main__``).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("pgqueuer", "procrastinate"):
        print(
            "usage: python -m bench.peers pgqueuer|procrastinate setup|drain ...", file=sys.stderr
        )
        return 2
    if argv[0] == "pgqueuer":
        from bench.peers import pgq_peer

        return pgq_peer.main(argv[1:])
    from bench.peers import procrastinate_peer

    return procrastinate_peer.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
