"""The transition table against the SQL that writes the trail: every event name a statement
in leaseq/sql/queries/ stores is in ``states.TRANSITIONS`` (and every recorded event of the table is
written somewhere), so the oracle of the stateful test cannot drift from the code again."""

from __future__ import annotations

import re

import pytest

from leaseq.sql import query_files
from leaseq.states import EVENTS, TRANSITIONS, UNRECORDED_EVENTS, JobStatus, allowed

_INSERT = "INSERT INTO {schema}.job_events"


def _queries_sql() -> str:
    return "\n".join(text for _, text in sorted(query_files().items()))


def _top_level(text: str, start: int, stop_word: str | None = None) -> tuple[list[str], int]:
    """Split ``text`` from ``start`` at commas outside parentheses and quotes; stop at the
    closing parenthesis of the enclosing list, or at ``stop_word`` at the top level."""
    items: list[str] = []
    depth, i, begin = 0, start, start
    while i < len(text):
        c = text[i]
        if c == "'":
            i = text.index("'", i + 1) + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and c == ",":
            items.append(text[begin:i].strip())
            begin = i + 1
        elif (
            depth == 0
            and stop_word
            and text.startswith(stop_word, i)
            and text[i - 1].isspace()
            and text[i + len(stop_word)].isspace()
        ):
            break
        i += 1
    items.append(text[begin:i].strip())
    return items, i


def _literal(expr: str) -> str | None:
    m = re.fullmatch(r"'(\w+)'(?:::\{schema\}\.job_status)?", expr)
    return m.group(1) if m else None


def _event_names(expr: str) -> set[str]:
    """The names an event expression can yield: a literal, or a CASE of literals."""
    if (name := _literal(expr)) is not None:
        return {name}
    branches = re.findall(r"\b(?:THEN|ELSE)\s+(\S+)", expr)
    names = {_literal(b) for b in branches}
    assert expr.startswith("CASE") and branches and None not in names, (
        f"cannot tell which events this writes (extend the test): {expr}"
    )
    return {n for n in names if n is not None}


def _written_events() -> tuple[set[str], list[tuple[str, str, str | None]]]:
    """Every event name the statements write, and the (event, from, to) of rows whose three
    values are all literals."""
    text = _queries_sql()
    names: set[str] = set()
    literal_moves: list[tuple[str, str, str | None]] = []
    for m in re.finditer(re.escape(_INSERT), text):
        open_paren = text.index("(", m.end())
        columns, end = _top_level(text, open_paren + 1)
        select = re.compile(r"\s*SELECT\s+").match(text, end + 1)
        assert select, f"job_events insert without INSERT ... SELECT at {m.start()}"
        values, _ = _top_level(text, select.end(), stop_word="FROM")
        assert len(values) == len(columns), (columns, values)
        row = dict(zip(columns, values, strict=True))
        names |= _event_names(row["event"])
        event, src = _literal(row["event"]), _literal(row["from_status"])
        dst = _literal(row["to_status"]) if "to_status" in row else None
        if event and src and (dst or "to_status" not in row):
            literal_moves.append((event, src, dst))
    return names, literal_moves


def test_every_event_the_sql_writes_is_in_the_transition_table() -> None:
    written, _ = _written_events()
    assert len(written) >= 8, f"the parser found too little, it is broken: {written}"
    assert written <= EVENTS, f"events written but not in states.TRANSITIONS: {written - EVENTS}"


def test_every_recorded_event_of_the_table_is_written_by_some_statement() -> None:
    written, _ = _written_events()
    assert written == EVENTS - UNRECORDED_EVENTS
    assert not written & UNRECORDED_EVENTS


def test_literal_moves_in_the_sql_are_allowed_transitions() -> None:
    _, moves = _written_events()
    assert moves, "no statement writes a fully literal (event, from, to)"
    for event, src, dst in moves:
        assert allowed(event, src, dst), (event, src, dst)


@pytest.mark.parametrize(
    ("event", "src", "dst", "ok"),
    [
        ("claimed", "pending", "running", True),
        ("claimed", "running", "running", False),
        ("succeeded", "running", "succeeded", True),
        ("succeeded", "dead", "succeeded", False),
        ("retry_scheduled", "running", "pending", True),
        ("retry_scheduled", "pending", "pending", False),
        ("dead", "running", "dead", True),
        ("cancelled", "running", "cancelled", True),
        ("cancelled", "pending", "cancelled", True),
        ("cancelled", "succeeded", "cancelled", False),
        ("lease_expired", "running", "cancelled", True),
        ("lease_expired", "running", "succeeded", False),
        ("released", "running", "pending", True),
        ("cancel_requested", "running", "running", True),
        ("cancel_requested", "pending", "cancelled", False),
        ("replayed", "dead", "pending", True),
        ("replayed", "cancelled", "pending", True),
        ("replayed", "succeeded", "pending", False),
        ("key_skipped", "dead", "dead", True),
        ("key_skipped", "pending", "pending", False),
        ("purged", "dead", None, True),
        ("purged", "succeeded", None, False),
        ("enqueued", None, "pending", True),
        # The old names and an unknown status are not transitions.
        ("release", "running", "pending", False),
        ("replay", "dead", "pending", False),
        ("fail", "running", "dead", False),
        ("claimed", "pending", "sleeping", False),
    ],
)
def test_transition_table(event: str, src: str | None, dst: str | None, ok: bool) -> None:
    assert allowed(event, src, dst) is ok
    if src is not None and dst is not None and src != "sleeping" and dst != "sleeping":
        assert allowed(event, JobStatus(src), JobStatus(dst)) is ok


def test_terminal_states_are_left_only_by_operator_actions() -> None:
    for move in TRANSITIONS:
        if move.from_status is not None and move.from_status.terminal:
            assert move.event in {"replayed", "replay_refused", "key_skipped", "purged"}, move
