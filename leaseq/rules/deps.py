"""Pure: job dependencies as given at enqueue (``depends_on``), their checks, and how the
items of one ``enqueue_many`` refer to each other (:class:`Ref`).

A dependency names a job that already exists (an id) or an EARLIER item of the same
``enqueue_many`` call (``Ref(i)``, or a negative ``Ref`` counting back from the item
itself: ``Ref(-1)`` is the item just before). Since a job can only depend on jobs that
existed before it, the dependency graph can never hold a cycle: a reference to the item
itself or to a later one is refused, and so is an unknown id (by the enqueue, in the
database, before anything is stored).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leaseq.errors import ConfigError

#: What a dependency that ends dead or cancelled does to its dependent: ``cancel`` it (it
#: ends cancelled with DEPENDENCY_FAILED and never runs), let it ``run`` anyway (the
#: failure shows in ``ctx.dependency_results()``), or ``ignore`` the dependency (the
#: dependent runs, and dependency_results leaves that dependency out).
ON_DEAD = ("cancel", "run", "ignore")

#: At most this many dependencies per job (a fan-in of 10,000 is fine; a typo is not).
MAX_DEPENDENCIES = 100_000


@dataclass(frozen=True)
class Ref:
    """An earlier item of the same ``enqueue_many`` call: its index (0-based), or a
    negative offset from the item that names it (``Ref(-1)``: the item just before)."""

    index: int


@dataclass(frozen=True)
class Dep:
    """One dependency with its own policy (overrides the job's ``on_dead``)."""

    target: int | Ref
    on_dead: str = "cancel"


#: A checked dependency: (job id or Ref, on_dead).
Edge = tuple["int | Ref", str]


def check_on_dead(value: object) -> str:
    if value not in ON_DEAD:
        raise ConfigError(f"on_dead must be one of {', '.join(ON_DEAD)}, got {value!r}")
    return str(value)


def check_depends_on(depends_on: object, on_dead: object) -> tuple[Edge, ...] | None:
    """The checked edges of one job, or None without dependencies."""
    if depends_on is None:
        return None
    policy = check_on_dead(on_dead)
    if isinstance(depends_on, (str, bytes)) or not isinstance(depends_on, Sequence):
        raise ConfigError("depends_on must be a list of job ids, Ref or Dep")
    if len(depends_on) > MAX_DEPENDENCIES:
        raise ConfigError(f"at most {MAX_DEPENDENCIES} dependencies per job")
    edges: dict[int | Ref, str] = {}
    for item in depends_on:
        target: Any = item
        rule = policy
        if isinstance(item, Dep):
            target, rule = item.target, check_on_dead(item.on_dead)
        if isinstance(target, bool) or not isinstance(target, (int, Ref)):
            raise ConfigError(f"a dependency is a job id, Ref or Dep, got {target!r}")
        if isinstance(target, int) and target < 1:
            raise ConfigError(f"a dependency's job id must be positive, got {target}")
        edges[target] = rule
    return tuple(edges.items()) or None


def resolve(position: int, edges: Sequence[Edge], ids: Sequence[int]) -> list[tuple[int, str]]:
    """The edges of item ``position`` with each Ref turned into the id of the earlier item
    it names (``ids``: the ids of the batch's items, in order)."""
    out: dict[int, str] = {}
    for target, rule in edges:
        if isinstance(target, Ref):
            index = target.index + position if target.index < 0 else target.index
            if not 0 <= index < position:
                raise ConfigError(
                    f"item {position} depends on Ref({target.index}): a dependency must be "
                    "an earlier item of the batch (no cycles)"
                )
            target = ids[index]
        out[target] = rule
    return list(out.items())
