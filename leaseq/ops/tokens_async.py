"""The HTTP API's tokens (create, revoke, list, look up by the presented secret) and its
audit trail (one row per request answered for a token). The rules are in
``leaseq.rules.tokens``; migration 0023 holds the tables.
"""

from __future__ import annotations

from typing import Any

from leaseq import validate
from leaseq.errors import ConfigError
from leaseq.ops.base_async import AsyncClientBase
from leaseq.rules.tokens import ApiToken, check_queues, check_scopes, new_token, token_hash


class AsyncTokenOps(AsyncClientBase):
    async def create_token(
        self,
        name: str,
        *,
        scopes: list[str],
        queues: list[str] | None = None,
        actor: str | None = None,
    ) -> str:
        """A new bearer token for the HTTP API; returns it (it is never shown again: only
        its hash is stored). A name is never reused, even after a revoke."""
        token, digest = new_token()
        params = {
            "name": validate.check_name("token", name),
            "hash": digest,
            "scopes": check_scopes(scopes),
            "queues": check_queues(queues),
            "actor": None if actor is None else str(actor)[:200],
        }
        if not await self._rows("create_api_token", params):
            raise ConfigError(f"a token named {name!r} exists (names are not reused)")
        return token

    async def revoke_token(self, name: str) -> bool:
        """Revoke the token ``name`` at once; False when there is no live token of that name."""
        rows = await self._rows("revoke_api_token", {"name": validate.check_name("token", name)})
        return bool(rows)

    async def tokens(self) -> list[dict[str, Any]]:
        """Every token (never its secret): name, scopes, queues, who made it, when, revoked."""
        keys = (
            "name",
            "scopes",
            "queues",
            "created_by",
            "created_at",
            "revoked_at",
            "last_used_at",
        )
        return [dict(zip(keys, row, strict=True)) for row in await self._rows("list_api_tokens")]

    async def token_for(self, token: str) -> ApiToken | None:
        """The live token presented as ``token``, or None."""
        if not token.isascii() or len(token) > 200:
            return None
        rows = await self._rows("api_token_by_hash", {"hash": token_hash(token)})
        if not rows:
            return None
        name, scopes, queues = rows[0]
        return ApiToken(name, tuple(scopes), None if queues is None else tuple(queues))

    async def record_api_request(
        self, actor: str, method: str, path: str, status: int, detail: str | None = None
    ) -> None:
        params = {"actor": actor, "method": method, "path": path, "status": status}
        await self._rows("record_api_request", {**params, "detail": detail})

    async def api_requests(
        self, *, actor: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The API's audit trail, newest first."""
        params = {"actor": actor, "limit": validate.check_int("limit", limit, 1, 100_000)}
        keys = ("id", "at", "actor", "method", "path", "status", "detail")
        return [
            dict(zip(keys, row, strict=True)) for row in await self._rows("api_requests", params)
        ]

    async def prune_api_requests(self, *, older_than: float, batch_size: int = 1000) -> int:
        """Delete trail rows older than ``older_than`` seconds (at most ``batch_size``)."""
        params = {
            "older_than": validate.check_positive_seconds("older_than", older_than, 1e10),
            "limit": validate.check_int("batch_size", batch_size, 1, 100_000),
        }
        return len(await self._rows("prune_api_requests", params))
