"""Encrypted values at rest, pure: keys, the envelope a sealed value is stored as, sealing
and opening (AES-256-GCM, the ``cryptography`` library of the ``leaseq[crypto]`` extra).

A sealed value is stored in its jsonb column as an envelope::

    {"leaseq:enc": 1, "kid": "<key id>", "n": "<nonce, base64>", "c": "<ciphertext, base64>"}

``c`` is the JSON text of the value, encrypted and authenticated with the key ``kid`` names
(its SHA-256, shortened: a key names itself, nothing else needs configuring) and with what
the value is (``payload``, ``result``, ``effect``, ``signal``) as associated data, so a
ciphertext copied into another kind of column does not open. Several keys are held at once:
the first (newest) seals, any opens; ``leaseq keys rotate`` re-seals stored values under the
newest (``leaseq.ops.payloads_async``). Nothing here does I/O.

What it protects: the values in the database, its WAL, backups and replicas, and what the
dashboard, CLI and metrics show. What it does not: task names, queues, times and every other
column stay plain; keys are in the memory of every process that enqueues or runs such jobs.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from leaseq.errors import ConfigError, EncryptionError

#: The envelope's marker key; a payload whose top level has it is a sealed value.
SEALED = "leaseq:enc"
#: The environment variable of the keys: comma-separated, newest first.
KEYS_ENV = "LEASEQ_ENCRYPTION_KEYS"
#: What a sealed value is (its associated data): a value sealed as one kind opens as no other.
KINDS = ("payload", "result", "effect", "signal")
_KEY_BYTES = 32
_NONCE_BYTES = 12


def generate_key() -> str:
    """A new random key, as ``LEASEQ_ENCRYPTION_KEYS`` and ``App(encryption_keys=)`` take it."""
    return base64.urlsafe_b64encode(secrets.token_bytes(_KEY_BYTES)).decode().rstrip("=")


def key_id(raw: bytes) -> str:
    """The id a key is known by in envelopes: 12 characters of its SHA-256."""
    digest = hashlib.sha256(b"leaseq-key-id:" + raw).digest()
    return base64.urlsafe_b64encode(digest).decode()[:12]


def _decode_key(text: str, position: int) -> bytes:
    cleaned = text.strip()
    try:
        raw = base64.urlsafe_b64decode(cleaned + "=" * (-len(cleaned) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != _KEY_BYTES:
        raise ConfigError(
            f"encryption key {position} is not a key from `leaseq keys generate` "
            f"(32 bytes, URL-safe base64)"
        )
    return raw


Base64 = tuple[Callable[[str], bytes], Callable[[bytes], bytes]]


def binascii_base64() -> Base64:
    """Standard base64 (strict: a character outside the alphabet, or bad padding, is an
    error) with the standard library: about 2 ns a character to decode."""
    decode = functools.partial(binascii.a2b_base64, strict_mode=True)
    encode = functools.partial(binascii.b2a_base64, newline=False)
    return decode, encode


def fast_base64() -> Base64 | None:
    """The same with pybase64 (SIMD, part of ``leaseq[crypto]``) where it is installed:
    decoding a 1 KB payload's ciphertext took longer than decrypting it (issue 34)."""
    try:
        import pybase64
    except ImportError:
        return None
    return functools.partial(pybase64.b64decode, validate=True), pybase64.b64encode


_decode64, _encode64 = fast_base64() or binascii_base64()


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ConfigError(
            "encryption needs the cryptography library: pip install 'leaseq[crypto]'"
        ) from None
    return AESGCM


def is_sealed(value: Any) -> bool:
    """Is this stored value an envelope? (One dict lookup: it runs for every claimed job.)"""
    return type(value) is dict and SEALED in value


def sealed_key_id(value: Any) -> str | None:
    """The key id of an envelope (None for anything else)."""
    return str(value.get("kid")) if is_sealed(value) else None


def describe(value: Any) -> str:
    """How the dashboard and the CLI show a sealed value: never its content."""
    return f"(encrypted with key {sealed_key_id(value)})"


#: Top-level keys of what leaseq itself stores in a payload column: an envelope, and an
#: offloaded payload's marker (``leaseq.payload_store``). A payload filter naming them
#: would match leaseq's own records, not the application's data: refused.
RESERVED_KEYS = frozenset({SEALED, "leaseq:ref"})


def shown(value: Any) -> Any:
    """A stored payload as inspection shows it (CLI, dashboard): a sealed one as a line
    saying so, an offloaded one as where it is; anything else as it is. Never opened."""
    if type(value) is dict:
        if SEALED in value:
            return describe(value)
        if "leaseq:ref" in value:
            return f"(offloaded to {value.get('leaseq:ref')}, {value.get('bytes')} bytes)"
    return value


class Keyring:
    """The keys of this process, newest first: the newest seals, any opens."""

    def __init__(self, keys: Sequence[str]) -> None:
        if isinstance(keys, str):
            keys = [keys]
        raw = [_decode_key(k, i + 1) for i, k in enumerate(keys) if k.strip()]
        if not raw:
            raise ConfigError("no encryption keys given: generate one with `leaseq keys generate`")
        aesgcm = _aesgcm()
        self._ciphers: dict[str, Any] = {}
        for key in raw:
            self._ciphers.setdefault(key_id(key), aesgcm(key))
        self.newest = key_id(raw[0])

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Keyring | None:
        """The keys of ``LEASEQ_ENCRYPTION_KEYS`` (None when it is unset or empty)."""
        text = (os.environ if environ is None else environ).get(KEYS_ENV, "")
        keys = [k for k in text.split(",") if k.strip()]
        return cls(keys) if keys else None

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._ciphers)

    def seal(self, text: str, kind: str) -> str:
        """The envelope (JSON text) of ``text`` (a value's JSON) under the newest key."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        data = self._ciphers[self.newest].encrypt(nonce, text.encode(), kind.encode())
        return json.dumps(
            {
                SEALED: 1,
                "kid": self.newest,
                "n": _encode64(nonce).decode(),
                "c": _encode64(data).decode(),
            },
            separators=(",", ":"),
        )

    def open(self, envelope: Mapping[str, Any], kind: str) -> str:
        """The JSON text sealed in ``envelope``; a key this keyring lacks, or a value that
        does not authenticate (a wrong key, a changed ciphertext, another kind), is a
        one-line :class:`EncryptionError` naming which."""
        kid = str(envelope.get("kid"))
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise EncryptionError(
                "ENCRYPTION_KEY_MISSING",
                f"the {kind} is encrypted with key {kid}, which this process does not have "
                f"(it has {', '.join(self._ciphers)})",
            )
        try:
            nonce = _decode64(envelope["n"])
            data = _decode64(envelope["c"])
            return str(cipher.decrypt(nonce, data, kind.encode()).decode())
        except Exception:
            raise EncryptionError(
                "ENCRYPTION_FAILED",
                f"the {kind} encrypted with key {kid} does not authenticate (changed, or "
                "sealed as something else)",
            ) from None

    def reseal(self, envelope: Mapping[str, Any], kind: str) -> str | None:
        """``envelope`` sealed again under the newest key (None: it already is)."""
        if envelope.get("kid") == self.newest:
            return None
        return self.seal(self.open(envelope, kind), kind)


class Encryption:
    """Which values this application encrypts, and with which keys. ``tasks``: the tasks
    whose values are sealed (a callable answering per task, or None for every task)."""

    def __init__(
        self,
        keys: Keyring | Sequence[str] | None = None,
        *,
        tasks: Callable[[str], bool] | frozenset[str] | None = None,
    ) -> None:
        if keys is None:
            keyring = Keyring.from_env()
            if keyring is None:
                raise ConfigError(
                    f"encryption needs keys: set {KEYS_ENV} or pass encryption_keys "
                    "(`leaseq keys generate` makes one)"
                )
        else:
            keyring = keys if isinstance(keys, Keyring) else Keyring(keys)
        self.keyring = keyring
        if tasks is None:
            self._applies: Callable[[str], bool] = lambda _task: True
        elif callable(tasks):
            self._applies = tasks
        else:
            names = frozenset(tasks)
            self._applies = names.__contains__

    def applies(self, task: str) -> bool:
        return self._applies(task)

    def seal_if(self, task: str, text: str, kind: str) -> str:
        """``text`` sealed when ``task``'s values are encrypted, else as it is."""
        return self.keyring.seal(text, kind) if self._applies(task) else text


def open_value(keyring: Keyring | None, value: Any, kind: str) -> Any:
    """A stored value as the application sees it: an envelope opened (with ``keyring``),
    anything else as it is. A sealed value without keys is an :class:`EncryptionError`."""
    if not is_sealed(value):
        return value
    if keyring is None:
        raise EncryptionError(
            "ENCRYPTION_KEY_MISSING",
            f"the {kind} is encrypted with key {sealed_key_id(value)} and this process has "
            f"no encryption keys ({KEYS_ENV})",
        )
    return json.loads(keyring.open(value, kind))
