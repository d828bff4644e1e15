"""Input checks without a database: what a payload or a name may be, and that every refusal
is one line. The boundaries: nesting depth, NUL and lone surrogates, non-string keys, a
trailing newline after an otherwise valid name."""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leaseq import validate
from leaseq.errors import ConfigError, PayloadError
from leaseq.sql import check_schema_name
from leaseq.validate import PAYLOAD_MAX_DEPTH, encode_payload


def nested(levels: int) -> Any:
    """A list nested ``levels`` deep (``[]`` is one level), built without recursion."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def _refused(payload: Any) -> str:
    with pytest.raises(PayloadError) as info:
        encode_payload(payload)
    message = str(info.value)
    assert message and "\n" not in message
    return message


# -- depth ---------------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [PAYLOAD_MAX_DEPTH + 1, 990, 5_000, 10_000])
def test_payload_nested_past_the_limit_is_a_payload_error_not_recursion(levels: int) -> None:
    # 990 levels encode fine but the worker's decoder would overflow; 5,000 and 10,000 used
    # to raise RecursionError out of enqueue.
    assert f"more than {PAYLOAD_MAX_DEPTH} levels" in _refused(nested(levels))
    assert f"more than {PAYLOAD_MAX_DEPTH} levels" in _refused({"a": [{"b": nested(levels)}]})


def test_payload_at_the_depth_limit_is_accepted_and_round_trips() -> None:
    value = {"k": nested(PAYLOAD_MAX_DEPTH - 1)}
    assert json.loads(encode_payload(value)) == value


def test_many_shallow_containers_are_not_mistaken_for_depth() -> None:
    # More brackets than the limit, so the payload is walked; it is only three deep.
    value = {"items": [{"id": i, "tags": ["a"]} for i in range(200)]}
    assert json.loads(encode_payload(value)) == value


def test_a_circular_payload_is_a_payload_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    _refused(loop)


# -- NUL and surrogates ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["C:\\u0000dir", "\\u0000", "\\\\\\u0000", "\\\\u0000 twice \\u0000", "u0000"],
)
def test_backslash_u0000_as_text_is_not_a_nul(text: str) -> None:
    assert json.loads(encode_payload({"p": text})) == {"p": text}
    assert json.loads(encode_payload({text: 1})) == {text: 1}


@pytest.mark.parametrize("text", ["\x00", "a\x00b", "\\\x00", "\\\\\x00", "C:\\u0000\x00"])
def test_a_real_nul_is_refused_in_values_and_keys(text: str) -> None:
    assert "NUL" in _refused({"p": text})
    assert "NUL" in _refused({text: 1})
    assert "NUL" in _refused([text])


@pytest.mark.parametrize("text", ["\ud800", "a\udfffb", "\ud83d", "\ud83d\ude00"])
def test_lone_surrogates_are_a_payload_error_not_unicode_encode_error(text: str) -> None:
    # "\ud83d\ude00" is two code points in a Python str, not the emoji: still not storable.
    assert "surrogate" in _refused({"p": text})
    assert "surrogate" in _refused({text: "v"})


def test_real_astral_characters_are_fine() -> None:
    assert json.loads(encode_payload({"p": "🚀 名前 é"})) == {"p": "🚀 名前 é"}


# -- keys ----------------------------------------------------------------------------------


class Colour(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize(
    "payload",
    [
        {1: "a", "1": "b"},  # used to be stored silently as {"1": "b"}
        {1: "a"},
        {-2: "a"},
        {1.5: "a"},
        {1e20: "a"},
        {True: "a"},
        {False: "a"},
        {None: "a"},
        {Colour.RED: "a"},
        {"outer": [{"inner": {7: "deep"}}]},
    ],
)
def test_non_string_keys_are_refused_rather_than_converted(payload: Any) -> None:
    assert "non-string object key" in _refused(payload)


@pytest.mark.parametrize("key", ["1", "2024", "-3", "true", "null", "v2", "name"])
def test_string_keys_that_look_converted_are_kept(key: str) -> None:
    assert json.loads(encode_payload({key: {key: 1}})) == {key: {key: 1}}


# -- the fidelity property -----------------------------------------------------------------

_special = st.sampled_from(["\x00", "\ud800", "\\u0000", "\\\x00", "\\", '"', "1", "true"])
_strings = st.one_of(st.text(max_size=8), _special, st.builds(str.__add__, st.text(), _special))
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    _strings,
)
_keys = st.one_of(_strings, st.integers(-5, 5), st.booleans(), st.none())
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


def _storable(value: Any) -> bool:
    """The reference rule, written the slow and obvious way."""
    if isinstance(value, str):
        return "\x00" not in value and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return all(_storable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _storable(k) and _storable(v) for k, v in value.items())
    return True


@given(_values)
def test_a_payload_is_stored_exactly_or_refused_in_one_line(value: Any) -> None:
    if _storable(value):
        assert json.loads(encode_payload(value)) == value
    else:
        _refused(value)


# -- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["t\n", "t\n\n", "\nt", "t\r", "q:1\n"])
def test_a_name_with_a_newline_is_refused(name: str) -> None:
    with pytest.raises(ConfigError):
        validate.check_name("task", name)
    with pytest.raises(ConfigError):  # the cached fast path must agree
        validate.check_name("task", name)


@pytest.mark.parametrize("schema", ["s\n", "leaseq\n", "a_b\n"])
def test_a_schema_name_with_a_trailing_newline_is_refused(schema: str) -> None:
    with pytest.raises(ConfigError):
        check_schema_name(schema)


# -- other text that reaches PostgreSQL ------------------------------------------------------


@pytest.mark.parametrize("bad", ["k\x00", "k\ud800"])
def test_keys_and_worker_ids_postgresql_cannot_store_are_config_errors(bad: str) -> None:
    for check in (validate.check_idempotency_key, validate.check_ordering_key):
        with pytest.raises(ConfigError):
            check(bad)
    with pytest.raises(ConfigError):
        validate.check_worker_id(bad)


def test_error_codes_and_details_from_handlers_are_made_storable() -> None:
    assert validate.bound_code("E\ud800\x00X") == "E?X"
    detail = validate.bound_detail("bad \ud83d byte \x00 here")
    assert detail == "bad ? byte  here"
    detail.encode("utf-8")


def test_a_signal_name_leaves_room_for_its_waits_step_names() -> None:
    longest = "s" * validate.SIGNAL_NAME_MAX
    assert validate.check_signal_name(longest) == longest
    # the step of the millionth-but-one wait for it is still a valid step name
    assert validate.check_name("step", f"wait:{longest}/999999")
    with pytest.raises(ConfigError, match="too long: at most 116 characters"):
        validate.check_signal_name(longest + "s")
    with pytest.raises(ConfigError, match="signal name"):
        validate.check_signal_name("")
