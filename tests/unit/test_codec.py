"""Sealed values at rest (leaseq.codec), without a database: round trips, what does not
open and why, key parsing, rotation's re-seal, and which tasks an Encryption seals."""

from __future__ import annotations

import json
import secrets

import pytest

from leaseq.codec import (
    SEALED,
    Encryption,
    Keyring,
    binascii_base64,
    fast_base64,
    generate_key,
    is_sealed,
    open_value,
    sealed_key_id,
    shown,
)
from leaseq.errors import ConfigError, EncryptionError

OLD, NEW = generate_key(), generate_key()


def test_a_sealed_value_opens_to_its_json_and_names_its_key() -> None:
    ring = Keyring([NEW, OLD])
    envelope = json.loads(ring.seal('{"to":"ada@example.com"}', "payload"))
    assert is_sealed(envelope) and envelope[SEALED] == 1
    assert "ada" not in json.dumps(envelope)
    assert sealed_key_id(envelope) == ring.newest
    assert ring.open(envelope, "payload") == '{"to":"ada@example.com"}'
    assert open_value(ring, envelope, "payload") == {"to": "ada@example.com"}


def test_each_seal_is_different_but_opens_the_same() -> None:
    ring = Keyring([NEW])
    a, b = (json.loads(ring.seal("[1]", "result")) for _ in range(2))
    assert a["c"] != b["c"] and a["n"] != b["n"]
    assert ring.open(a, "result") == ring.open(b, "result") == "[1]"


def test_a_value_sealed_as_one_kind_does_not_open_as_another() -> None:
    ring = Keyring([NEW])
    envelope = json.loads(ring.seal("{}", "payload"))
    with pytest.raises(EncryptionError) as failed:
        ring.open(envelope, "result")
    assert failed.value.code == "ENCRYPTION_FAILED"


def test_a_changed_ciphertext_does_not_authenticate() -> None:
    ring = Keyring([NEW])
    envelope = json.loads(ring.seal('{"amount": 10}', "payload"))
    data = bytearray(envelope["c"].encode())
    data[3] = ord("A") if data[3] != ord("A") else ord("B")
    envelope["c"] = data.decode()
    with pytest.raises(EncryptionError, match="does not authenticate") as failed:
        ring.open(envelope, "payload")
    assert failed.value.code == "ENCRYPTION_FAILED"


def test_a_key_this_process_lacks_is_named() -> None:
    envelope = json.loads(Keyring([OLD]).seal("1", "payload"))
    with pytest.raises(EncryptionError, match="which this process does not have") as failed:
        Keyring([NEW]).open(envelope, "payload")
    assert failed.value.code == "ENCRYPTION_KEY_MISSING"
    with pytest.raises(EncryptionError, match="no encryption keys"):
        open_value(None, envelope, "payload")


def test_plain_values_pass_through_untouched() -> None:
    for value in (None, 1, "x", [1], {"a": 1}, {"leaseq": 1}):
        assert open_value(None, value, "payload") is value
        assert shown(value) is value


def test_rotation_reseals_under_the_newest_and_leaves_the_newest_alone() -> None:
    old = json.loads(Keyring([OLD]).seal('"v"', "effect"))
    ring = Keyring([NEW, OLD])
    resealed = ring.reseal(old, "effect")
    assert resealed is not None
    again = json.loads(resealed)
    assert sealed_key_id(again) == ring.newest != sealed_key_id(old)
    assert ring.reseal(again, "effect") is None
    assert Keyring([NEW]).open(again, "effect") == '"v"'


@pytest.mark.parametrize("bad", ["", "short", "x" * 43 + "!", "AAAA"])
def test_a_key_that_is_not_one_is_a_one_line_error(bad: str) -> None:
    with pytest.raises(ConfigError) as failed:
        Keyring([NEW, bad] if bad else [bad])
    assert "\n" not in str(failed.value)


def test_keys_come_from_the_environment_newest_first() -> None:
    ring = Keyring.from_env({"LEASEQ_ENCRYPTION_KEYS": f" {NEW} , {OLD} "})
    assert ring is not None and ring.newest == Keyring([NEW]).newest
    assert ring.key_ids == (Keyring([NEW]).newest, Keyring([OLD]).newest)
    assert Keyring.from_env({"LEASEQ_ENCRYPTION_KEYS": " "}) is None


def test_encryption_seals_only_the_tasks_it_names() -> None:
    only = Encryption([NEW], tasks=frozenset({"secret"}))
    assert is_sealed(json.loads(only.seal_if("secret", "{}", "payload")))
    assert only.seal_if("plain", "{}", "payload") == "{}"
    assert Encryption([NEW]).applies("anything")


def test_inspection_shows_what_a_value_is_never_its_content() -> None:
    envelope = json.loads(Keyring([NEW]).seal('{"card": "4111"}', "payload"))
    assert shown(envelope) == f"(encrypted with key {sealed_key_id(envelope)})"
    assert shown({"leaseq:ref": "pg", "bytes": 9}) == "(offloaded to pg, 9 bytes)"


def test_both_base64_codecs_agree_and_refuse_what_is_not_base64() -> None:
    """Envelopes are the same whichever codec wrote them (pybase64 where installed, the
    standard library otherwise), and both refuse a character outside the alphabet, which
    then reads as a value that does not authenticate, never as an unexpected error."""
    fast = fast_base64()
    assert fast is not None, "pybase64 is part of leaseq[crypto] and of the dev extras"
    slow = binascii_base64()
    for size in (0, 1, 12, 1028, 4099):
        raw = secrets.token_bytes(size)
        assert fast[1](raw) == slow[1](raw)
        assert fast[0](slow[1](raw).decode()) == slow[0](fast[1](raw).decode()) == raw
    text = slow[1](secrets.token_bytes(30)).decode()
    for decode, _ in (fast, slow):
        with pytest.raises(ValueError):
            decode(text[:5] + "!" + text[6:])
    envelope = json.loads(Keyring([NEW]).seal('{"n": 1}', "payload"))
    envelope["c"] = "!" + envelope["c"][1:]
    with pytest.raises(EncryptionError, match="does not authenticate"):
        Keyring([NEW]).open(envelope, "payload")
