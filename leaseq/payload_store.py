"""Where large payloads live when they are kept out of the jobs table (``App(offload_above=,
payload_store=)``, docs/payloads.md): the marker a job row keeps instead, the choice of a
store, and the S3-compatible object store (boto3, the ``leaseq[s3]`` extra).

The PostgreSQL store is the ``payloads`` table itself (``leaseq.ops.payloads_async`` writes
it in the enqueue's own transaction); it needs no object here. An S3 store uploads before
the job's insert commits and deletes on rollback; what an enqueue that died in between left
behind is found by the orphan sweep (objects no payload row names, older than a grace).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from leaseq.errors import ConfigError

#: The marker key: a job payload whose top level has it is offloaded.
OFFLOADED = "leaseq:ref"
#: Uploads and downloads of one batch run this many at a time.
_PARALLEL = 16
#: Offloaded payloads one fetch statement of a claim reads, about (bytes, by their markers).
#: One statement for a claim's hundred 1 MB payloads made the server read all of them while
#: the worker waited, then the worker decode all of them while the server idled; in parts,
#: on two connections, each part decoded as it arrives, the two overlap (issue 34).
FETCH_PART_BYTES = 4 * 1024 * 1024
#: The smallest offload threshold accepted: below it a marker is not much smaller.
MIN_OFFLOAD_ABOVE = 256


def is_offloaded(value: Any) -> bool:
    return type(value) is dict and OFFLOADED in value


def marker(store: str, size: int) -> str:
    """The JSON text a job row keeps for an offloaded payload."""
    return json.dumps({OFFLOADED: store, "bytes": size}, separators=(",", ":"))


def describe(value: Mapping[str, Any]) -> str:
    return f"(offloaded to {value.get(OFFLOADED)}, {value.get('bytes')} bytes)"


def fetch_parts(sizes: Sequence[tuple[int, int]], part_bytes: int | None = None) -> list[list[int]]:
    """Job ids in fetch parts of about ``part_bytes`` (default FETCH_PART_BYTES) each, by
    the sizes their markers give, in order; a part has at least one id."""
    limit = FETCH_PART_BYTES if part_bytes is None else part_bytes
    parts: list[list[int]] = []
    total = 0
    for job_id, size in sizes:
        if not parts or total + size > limit:
            parts.append([])
            total = 0
        parts[-1].append(job_id)
        total += size
    return parts


def marked_bytes(value: Any) -> int:
    """The size an offloaded payload's marker gives (0 when it gives none)."""
    size = value.get("bytes") if type(value) is dict else None
    return size if type(size) is int and size > 0 else 0


def decoded(text: str) -> Any:
    """A fetched payload's JSON text, decoded; one that does not decode, its ValueError
    (the claim ends that job dead, INVALID_PAYLOAD, and keeps the others)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        return exc


@dataclass
class S3Store:
    """An S3-compatible bucket for offloaded payloads. ``endpoint_url`` for a store other
    than AWS (MinIO, Ceph, ...); credentials as boto3 finds them (environment, profile) unless
    given. Objects are named ``<prefix><schema>/<uuid>``; give each installation a prefix of
    its own if buckets are shared: the orphan sweep deletes what no job of the schema names."""

    bucket: str
    prefix: str = "leaseq/"
    endpoint_url: str | None = None
    region_name: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    _client: Any = field(default=None, init=False, repr=False, compare=False)

    kind = "s3"

    def __post_init__(self) -> None:
        if not isinstance(self.bucket, str) or not self.bucket:
            raise ConfigError("S3Store needs a bucket name")
        if not isinstance(self.prefix, str):
            raise ConfigError("S3Store's prefix is text")

    def client(self) -> Any:
        if self._client is None:
            try:
                import boto3
            except ImportError:
                raise ConfigError(
                    "the S3 payload store needs boto3: pip install 'leaseq[s3]'"
                ) from None
            options = {
                k: v
                for k, v in (
                    ("endpoint_url", self.endpoint_url),
                    ("region_name", self.region_name),
                    ("aws_access_key_id", self.aws_access_key_id),
                    ("aws_secret_access_key", self.aws_secret_access_key),
                )
                if v is not None
            }
            self._client = boto3.client("s3", **options)
        return self._client

    def new_key(self, schema: str) -> str:
        return f"{self.prefix}{schema}/{uuid.uuid4().hex}"

    def put(self, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=self.bucket, Key=key, Body=data)

    def get(self, key: str) -> bytes | None:
        """The object's bytes, None when it does not exist."""
        client = self.client()
        try:
            found = client.get_object(Bucket=self.bucket, Key=key)
        except client.exceptions.NoSuchKey:
            return None
        body: bytes = found["Body"].read()
        return body

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Upload several objects at once (a bulk enqueue's offloaded payloads)."""
        if len(items) == 1:
            self.put(*items[0])
            return
        with ThreadPoolExecutor(min(len(items), _PARALLEL)) as pool:
            for done in pool.map(lambda item: self.put(*item), items):
                del done

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Several objects at once (a claim's offloaded payloads), in order."""
        if len(keys) == 1:
            return [self.get(keys[0])]
        with ThreadPoolExecutor(min(len(keys), _PARALLEL)) as pool:
            return list(pool.map(self.get, keys))

    def delete(self, keys: Sequence[str]) -> dict[str, str]:
        """Delete objects (an absent one counts as deleted); returns the keys that failed,
        with the store's reason."""
        failed: dict[str, str] = {}
        for start in range(0, len(keys), 1000):
            chunk = keys[start : start + 1000]
            answer = self.client().delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
            )
            for error in answer.get("Errors", []):
                failed[str(error.get("Key"))] = str(error.get("Message") or error.get("Code"))
        return failed

    def list_objects(self, schema: str) -> list[tuple[str, float]]:
        """(key, last modified as POSIX seconds) of every object under this schema's prefix."""
        found = []
        paginator = self.client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=f"{self.prefix}{schema}/"):
            for item in page.get("Contents", []):
                found.append((str(item["Key"]), float(item["LastModified"].timestamp())))
        return found


PayloadStore = S3Store | None  # None: the PostgreSQL table


def check_offload(offload_above: object, store: object) -> tuple[int | None, S3Store | None]:
    """The checked offload settings: a threshold in bytes (None: never offload) and the
    store (None: the ``payloads`` table)."""
    if store is not None and not isinstance(store, S3Store):
        raise ConfigError(f"payload_store is leaseq.S3Store(...) or None, got {store!r:.60}")
    if offload_above is None:
        if store is not None:
            raise ConfigError("payload_store needs offload_above (the size in bytes to offload)")
        return None, None
    if isinstance(offload_above, bool) or not isinstance(offload_above, int):
        raise ConfigError(f"offload_above is a size in bytes, got {offload_above!r:.60}")
    if offload_above < MIN_OFFLOAD_ABOVE:
        raise ConfigError(f"offload_above must be at least {MIN_OFFLOAD_ABOVE} bytes")
    return offload_above, store
