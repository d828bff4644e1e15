"""The web dashboard (the ``leaseq[web]`` extra): a Starlette app over a client's schema,
to run with ``leaseq web`` or mount in an ASGI app. See ``docs/dashboard.md``."""

from __future__ import annotations

from leaseq.web.app import create_app
from leaseq.web.security import BasicAuth

__all__ = ["BasicAuth", "create_app"]
