"""Payloads at rest: sealing (encryption) and offloading at enqueue, opening and fetching at
the claim, and the upkeep of both: ``rotate_keys`` (every sealed value under the newest key,
in bounded, resumable batches) and the payload store's deletes and orphan sweep.

Sealing is decided per task by the client's ``encryption`` (``leaseq.codec``); opening by
what a stored value is, whatever the task's settings now: a worker that meets a sealed
payload it cannot open ends the job dead with the reason (ENCRYPTION_KEY_MISSING,
ENCRYPTION_FAILED), and never hands the envelope to a handler. An offloaded payload is
fetched once per attempt, by the claim that took it (PAYLOAD_MISSING when it is gone).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from leaseq.codec import Keyring, is_sealed, open_value
from leaseq.codes import ErrorCode
from leaseq.errors import ConfigError, EncryptionError, PayloadError
from leaseq.models import Lease
from leaseq.ops.base_async import AsyncClientBase
from leaseq.payload_store import decoded, fetch_parts, is_offloaded, marked_bytes, marker
from leaseq.rows import Unclaimable

log = logging.getLogger("leaseq.payloads")

#: Rows one rotation batch re-seals (one short transaction each).
ROTATE_BATCH = 500
#: Fetch statements of one claim's offloaded payloads that run at once, each on a pooled
#: connection, each reading a part of about FETCH_PART_BYTES (``leaseq.payload_store``).
FETCH_LANES = 2
#: How old an unreferenced object must be before the orphan sweep deletes it: an enqueue
#: uploads before its insert commits, and a slow transaction must not lose its payload.
ORPHAN_GRACE = 3600.0


@dataclass(frozen=True)
class Offload:
    """An offloaded payload on its way to its store: the text (pg) or the uploaded object's
    key (s3), its size, and the key it is sealed with (None: plain)."""

    store: str
    data: str | None
    object_key: str | None
    size: int
    kid: str | None


@dataclass(frozen=True)
class RotationProgress:
    """Where ``rotate_keys`` is: values re-sealed so far, by table, and what is left."""

    rotated: dict[str, int]
    left: dict[str, int]


class AsyncPayloadOps(AsyncClientBase):
    # -- enqueue ------------------------------------------------------------------------

    def _payload_sealer(self) -> Callable[[str, str], str] | None:
        """job_params' hook: a payload's JSON text sealed when its task encrypts, with the
        size limit applied to what is stored."""
        encryption = self.encryption
        if encryption is None:
            return None
        limit = self.payload_limit

        def seal(task: str, text: str) -> str:
            if not encryption.applies(task):
                return text
            sealed = encryption.keyring.seal(text, "payload")
            if len(sealed) > limit:
                raise PayloadError(
                    f"payload is {len(sealed)} bytes once encrypted, over the limit of "
                    f"{limit} bytes"
                )
            return sealed

        return seal

    async def _offload(self, params_list: Sequence[dict[str, Any]]) -> list[str]:
        """Payloads over ``offload_above`` leave their jobs' parameters for a marker; an S3
        store's objects are uploaded now (before the insert: a failed upload stores
        nothing). Returns the uploaded keys (to delete if the enqueue does not commit)."""
        limit = self.offload_above
        if limit is None:
            return []
        store = self.payload_store
        uploads: list[tuple[str, bytes]] = []
        for params in params_list:
            text: str = params["payload"]
            if len(text) <= limit:  # characters <= bytes: most payloads stop here
                continue
            data = text.encode()
            if len(data) <= limit:
                continue
            kid = str(json.loads(text)["kid"]) if text.startswith('{"leaseq:enc"') else None
            if store is None:
                offload = Offload("pg", text, None, len(data), kid)
            else:
                key = store.new_key(self.schema)
                uploads.append((key, data))
                offload = Offload("s3", None, key, len(data), kid)
            params["offload"] = offload
            params["payload"] = marker(offload.store, offload.size)
        if uploads and store is not None:
            await asyncio.to_thread(store.put_many, uploads)
        return [k for k, _ in uploads]

    def _stores_payloads(self, params_list: Sequence[dict[str, Any]]) -> bool:
        """Must these jobs' enqueue also write the payload store? Yes for an offloaded
        payload, and, where payloads are offloaded, for a unique key's replace (the holder's
        old payload may be in the store)."""
        if self.offload_above is None:
            return False
        return any("offload" in p or p["unique"] is not None for p in params_list)

    async def _store_offloaded(
        self, conn: AsyncConnection[Any], ids: Sequence[Any], params_list: Sequence[dict[str, Any]]
    ) -> list[str]:
        """In the enqueue's transaction: the payload rows of the jobs it stored (inserted, or
        a pending holder whose payload was replaced). Returns the keys of uploads no job took
        (a unique key held: nothing was stored)."""
        rows: list[tuple[int, Offload]] = []
        unused: list[str] = []
        inline_again: list[int] = []
        for result, params in zip(ids, params_list, strict=True):
            offload: Offload | None = params.get("offload")
            took = getattr(result, "inserted", True) or getattr(result, "replaced", False)
            if offload is None:
                if getattr(result, "replaced", False):
                    inline_again.append(int(result))
                continue
            if took:
                rows.append((int(result), offload))
            elif offload.object_key is not None:
                unused.append(offload.object_key)
        if inline_again:
            await self._rows("drop_payloads", {"ids": inline_again}, conn)
        if rows:
            params = {
                "ids": [i for i, _ in rows],
                "stores": [o.store for _, o in rows],
                "data": [o.data for _, o in rows],
                "object_keys": [o.object_key for _, o in rows],
                "bytes": [o.size for _, o in rows],
                "kids": [o.kid for _, o in rows],
            }
            await self._rows("store_payloads", params, conn)
        return unused

    async def _discard_objects(self, keys: Sequence[str]) -> None:
        """Best effort: uploads of an enqueue that did not commit (what is left, the orphan
        sweep removes)."""
        store = self.payload_store
        if not keys or store is None:
            return
        try:
            failed = await asyncio.to_thread(store.delete, list(keys))
        except Exception as exc:
            log.warning("could not delete %d unused payload object(s): %s", len(keys), exc)
            return
        if failed:
            log.warning("could not delete %d unused payload object(s)", len(failed))

    # -- the claim ----------------------------------------------------------------------

    async def _open_payloads(
        self,
        leases: list[Lease],
        unclaimable: list[Unclaimable],
        connection: AsyncConnection[Any] | None,
    ) -> list[Lease]:
        """Claimed leases with their payloads as the handler sees them: offloaded ones
        fetched, sealed ones opened. One that cannot be is set aside in ``unclaimable``
        (the claim ends it dead with the reason) and left out."""
        offloaded = [x for x in leases if is_offloaded(x.payload)]
        sealed = [x for x in leases if is_sealed(x.payload) or _is_callback(x.payload)]
        if not offloaded and not sealed:
            return leases
        fetched: dict[int, Any] = {}
        if offloaded:
            fetched = await self._fetch_payloads(offloaded, connection)
        kept: list[Lease] = []
        for lease in leases:
            value = lease.payload
            try:
                if is_offloaded(value):
                    value = fetched.get(lease.job_id, _MISSING)
                    if value is _MISSING:
                        raise _Refused(
                            ErrorCode.PAYLOAD_MISSING,
                            f"its payload is not in its store ({lease.payload.get('leaseq:ref')})",
                        )
                    if isinstance(value, ValueError):
                        raise value
                value = open_value(self.keyring, value, "payload")
                if _is_callback(value):  # a batch callback: its own payload sealed inside
                    value = {
                        **value,
                        "payload": open_value(self.keyring, value["payload"], "payload"),
                    }
            except EncryptionError as exc:
                unclaimable.append(_unclaimable(lease, ErrorCode(exc.code), str(exc)))
                continue
            except _Refused as exc:
                unclaimable.append(_unclaimable(lease, exc.code, exc.reason))
                continue
            except ValueError as exc:
                detail = f"payload cannot be decoded: {exc}"
                unclaimable.append(_unclaimable(lease, ErrorCode.INVALID_PAYLOAD, detail))
                continue
            if value is not lease.payload:
                object.__setattr__(lease, "payload", value)
            kept.append(lease)
        return kept

    async def _fetch_payloads(
        self, leases: Sequence[Lease], connection: AsyncConnection[Any] | None
    ) -> dict[int, Any]:
        """The offloaded payloads of ``leases``, decoded, by job id (a JSON text that does
        not decode: its ValueError; a payload not in its store: absent). Read in parts of
        about FETCH_PART_BYTES, on FETCH_LANES pooled connections at once (the caller's own
        connection reads them one after the other), each part decoded as soon as it arrives:
        the server reads the next part while this process decodes the last."""
        parts = fetch_parts([(x.job_id, marked_bytes(x.payload)) for x in leases])
        if connection is not None or len(parts) == 1:
            return await self._fetch_lane(parts, connection)
        lanes = [parts[i::FETCH_LANES] for i in range(min(FETCH_LANES, len(parts)))]
        found: dict[int, Any] = {}
        for one in await asyncio.gather(*[self._fetch_lane(lane, None) for lane in lanes]):
            found.update(one)
        return found

    async def _fetch_lane(
        self, parts: Sequence[Sequence[int]], connection: AsyncConnection[Any] | None
    ) -> dict[int, Any]:
        if connection is None:
            async with self._pooled() as conn:
                return await self._fetch_lane(parts, conn)
        found: dict[int, Any] = {}
        for ids in parts:
            found.update(await self._fetch_part(ids, connection))
        return found

    async def _fetch_part(
        self, ids: Sequence[int], connection: AsyncConnection[Any]
    ) -> dict[int, Any]:
        rows = await self._rows("payloads_of", {"ids": list(ids)}, connection)
        texts: dict[int, str] = {}
        objects: list[tuple[int, str]] = []
        for job_id, store, data, object_key in rows:
            if store == "pg":
                texts[int(job_id)] = data
            else:
                objects.append((int(job_id), str(object_key)))
        if objects and self.payload_store is not None:  # no store here: PAYLOAD_MISSING
            store = self.payload_store
            bodies = await asyncio.to_thread(store.get_many, [key for _, key in objects])
            for (job_id, _), body in zip(objects, bodies, strict=True):
                if body is not None:
                    texts[job_id] = body.decode()
        return {job_id: decoded(text) for job_id, text in texts.items()}

    def _open(self, value: Any, kind: str) -> Any:
        """A stored value as the application sees it (an EncryptionError when it is sealed
        and cannot be opened here)."""
        return open_value(self.keyring, value, kind)

    def _seal_value(self, task: str, text: str, kind: str) -> str:
        """A result's or an effect record's JSON text, sealed when ``task`` encrypts."""
        if self.encryption is None:
            return text
        return self.encryption.seal_if(task, text, kind)

    # -- upkeep -------------------------------------------------------------------------

    async def rotate_keys(
        self,
        *,
        batch: int = ROTATE_BATCH,
        progress: Callable[[RotationProgress], None] | None = None,
    ) -> RotationProgress:
        """Re-seal every stored value (payloads, offloaded payloads, results, effect and
        step records) under the newest key, ``batch`` rows per short transaction. Safe beside
        running workers (a row being claimed is skipped and taken on the next pass) and
        resumable: run it again after a crash, it picks up what is left. Every key that
        sealed a stored value must still be given (the newest first)."""
        keyring = self._rotation_keyring()
        rotated = {"jobs": 0, "payloads": 0, "results": 0, "effects": 0, "steps": 0}
        for _ in range(1000):  # passes: rows skipped as locked are taken the next time
            done = 0
            done += await self._rotate_table("jobs", keyring, batch, rotated, progress)
            done += await self._rotate_table("payloads", keyring, batch, rotated, progress)
            done += await self._rotate_table("results", keyring, batch, rotated, progress)
            done += await self._rotate_table("effects", keyring, batch, rotated, progress)
            done += await self._rotate_table("steps", keyring, batch, rotated, progress)
            left = await self._sealed_left(keyring)
            if not any(left.values()):
                break
            if not done:
                await asyncio.sleep(0.2)  # only rows locked by others are left: wait a bit
        result = RotationProgress(dict(rotated), left)
        if progress is not None:
            progress(result)
        return result

    def _rotation_keyring(self) -> Keyring:
        if self.keyring is None:
            raise ConfigError("rotating keys needs them: set LEASEQ_ENCRYPTION_KEYS (newest first)")
        return self.keyring

    async def sealed_left(self) -> dict[str, int]:
        """Values still sealed under an older key than the newest, by table."""
        return await self._sealed_left(self._rotation_keyring())

    async def _sealed_left(self, keyring: Keyring) -> dict[str, int]:
        ((jobs, results, effects, payloads, steps),) = await self._rows(
            "sealed_counts", {"kid": keyring.newest}
        )
        return {
            "jobs": jobs,
            "payloads": payloads,
            "results": results,
            "effects": effects,
            "steps": steps,
        }

    async def _rotate_table(
        self,
        table: str,
        keyring: Keyring,
        batch: int,
        rotated: dict[str, int],
        progress: Callable[[RotationProgress], None] | None,
    ) -> int:
        after, total = 0, 0
        while True:
            async with self._transaction() as conn:
                params = {"after": after, "kid": keyring.newest, "limit": batch}
                rows = await self._rows(f"rotation_{table}", params, conn)
                if not rows:
                    return total
                await self._reseal(conn, table, keyring, rows)
            after = int(rows[-1][0])
            total += len(rows)
            rotated[table] += len(rows)
            if progress is not None:
                progress(RotationProgress(dict(rotated), {}))

    async def _reseal(
        self, conn: AsyncConnection[Any], table: str, keyring: Keyring, rows: Sequence[Any]
    ) -> None:
        if table == "jobs":
            values = [keyring.reseal(json.loads(r[1]), "payload") for r in rows]
            params: dict[str, Any] = {"ids": [r[0] for r in rows], "values": values}
        elif table == "results":
            values = [keyring.reseal(json.loads(r[1]), "result") for r in rows]
            params = {"ids": [r[0] for r in rows], "values": values}
        elif table == "steps":  # step records are sealed as effect records
            params = {
                "ids": [r[0] for r in rows],
                "names": [r[1] for r in rows],
                "values": [keyring.reseal(json.loads(r[2]), "effect") for r in rows],
            }
        elif table == "effects":
            params = {
                "ids": [r[0] for r in rows],
                "names": [r[1] for r in rows],
                "keys": [r[2] for r in rows],
                "values": [keyring.reseal(json.loads(r[3]), "effect") for r in rows],
            }
        else:
            params = {"ids": [r[0] for r in rows], "data": [], "kid": keyring.newest}
            for _job_id, store, data, object_key in rows:
                if store == "pg":
                    params["data"].append(keyring.reseal(json.loads(data), "payload"))
                else:
                    await self._reseal_object(keyring, str(object_key))
                    params["data"].append(None)
        await self._rows(f"rotate_{table}", params, conn)

    async def _reseal_object(self, keyring: Keyring, key: str) -> None:
        store = self.payload_store
        if store is None:
            raise ConfigError("an offloaded payload is in S3: rotating it needs payload_store")
        body = await asyncio.to_thread(store.get, key)
        if body is None:
            return  # gone: the claim ends its job PAYLOAD_MISSING; nothing to re-seal
        resealed = keyring.reseal(json.loads(body), "payload")
        if resealed is not None:
            await asyncio.to_thread(store.put, key, resealed.encode())

    async def delete_payload_objects(self, *, limit: int = 500) -> int:
        """The maintenance service's round: delete the objects whose payload rows are gone
        (a batch; a failure is kept for the next round, with its reason). Returns how many
        were deleted."""
        store = self.payload_store
        if store is None:
            return 0
        async with self._transaction() as conn:
            keys = [
                str(r[0]) for r in await self._rows("next_payload_deletes", {"limit": limit}, conn)
            ]
            if not keys:
                return 0
            try:
                failed = await asyncio.to_thread(store.delete, keys)
            except Exception as exc:
                failed = dict.fromkeys(keys, f"{type(exc).__name__}: {exc}")
            done = [k for k in keys if k not in failed]
            if done:
                await self._rows("payload_deletes_done", {"keys": done}, conn)
            if failed:
                reason = next(iter(failed.values()))
                params = {"keys": list(failed), "error": reason}
                await self._rows("payload_deletes_failed", params, conn)
        return len(done)

    async def sweep_orphan_payloads(self, *, grace: float = ORPHAN_GRACE, limit: int = 1000) -> int:
        """Payload rows whose job is gone, and objects no payload row names (an enqueue that
        died between its upload and its commit), older than ``grace`` seconds: deleted.
        Returns how many rows and objects went."""
        rows = await self._rows("orphan_payload_rows", {"grace": grace, "limit": limit})
        removed = int(rows[0][0]) if rows else 0
        store = self.payload_store
        if store is None:
            return removed
        now = time.time()
        listing = await asyncio.to_thread(store.list_objects, self.schema)
        old = [key for key, modified in listing if now - modified > grace][:limit]
        if not old:
            return removed
        known = {str(r[0]) for r in await self._rows("known_object_keys", {"keys": old})}
        orphans = [k for k in old if k not in known]
        if orphans:
            failed = await asyncio.to_thread(store.delete, orphans)
            removed += len(orphans) - len(failed)
            if orphans:
                log.info("deleted %d orphan payload object(s)", len(orphans) - len(failed))
        return removed


def _is_callback(value: Any) -> bool:
    """A batch callback's payload whose own payload (the callback signature's) is sealed."""
    return type(value) is dict and "batch_id" in value and is_sealed(value.get("payload"))


_MISSING = object()


class _Refused(Exception):
    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


def _unclaimable(lease: Lease, code: ErrorCode, reason: str) -> Unclaimable:
    return Unclaimable(lease.job_id, lease.token, lease.owner, lease.ordering_key, code, reason)
