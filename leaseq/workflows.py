"""Pure: signatures (a task with its payload and options: ``task.sig(payload)``), and the
chains and groups built from them, turned into ``enqueue_many`` items that refer to each
other with :class:`~leaseq.rules.deps.Ref` (so a whole workflow is stored by one call, in one
transaction). Also the checked job spec a batch keeps for each callback.

``chain(a, b, c)``: b waits for a, c for b. ``group(a, b)``: a and b independent. A group
inside a chain waits for the step before it, and the step after it waits for every member
(a fan-out/fan-in, Celery's "chord"). Dependencies use on_dead "cancel" unless a signature
says otherwise: a step whose predecessor ended dead or cancelled is cancelled, and so are
the steps after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from leaseq import validate
from leaseq.errors import ConfigError
from leaseq.jobspec import BY_NAME, CALLBACK_OPTIONS, DEFAULTS, SIG_OPTIONS
from leaseq.rules.deps import Ref


@dataclass(frozen=True)
class Sig:
    """One job to enqueue later: ``task`` (a name), its payload and enqueue options."""

    task: str
    payload: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate.check_name("task", self.task)
        unknown = set(self.options) - SIG_OPTIONS
        if unknown:
            raise ConfigError(f"a signature cannot carry {', '.join(sorted(unknown))}")


@dataclass(frozen=True)
class Chain:
    steps: tuple[Sig | Group | Chain, ...]


@dataclass(frozen=True)
class Group:
    members: tuple[Sig | Group | Chain, ...]


Flow = Sig | Group | Chain


def _flows(items: Sequence[Any], what: str) -> tuple[Flow, ...]:
    if not items:
        raise ConfigError(f"{what} needs at least one signature")
    for item in items:
        if not isinstance(item, Sig | Group | Chain):
            raise ConfigError(f"{what} takes signatures (task.sig(...)), got {item!r}")
    return tuple(items)


def chain(*steps: Flow) -> Chain:
    """Each step starts after the one before it ended (succeeded, by default)."""
    return Chain(_flows(steps, "chain"))


def group(*members: Flow) -> Group:
    """Members run independently; in a chain, the next step waits for all of them."""
    return Group(_flows(members, "group"))


def flow_items(flow: Flow) -> list[dict[str, Any]]:
    """The ``enqueue_many`` items of a flow, in order, with dependencies as Refs."""
    items: list[dict[str, Any]] = []
    _add(flow, [], items)
    return items


def _add(flow: Flow, after: list[int], items: list[dict[str, Any]]) -> list[int]:
    """Append ``flow``'s jobs, each first job waiting for ``after`` (item indexes);
    returns the indexes of its last jobs (what a following step waits for)."""
    if isinstance(flow, Sig):
        item: dict[str, Any] = {"task": flow.task, "payload": flow.payload, **flow.options}
        if after:
            item["depends_on"] = [Ref(i) for i in after]
        items.append(item)
        return [len(items) - 1]
    if isinstance(flow, Group):
        ends: list[int] = []
        for member in flow.members:
            ends += _add(member, after, items)
        return ends
    for step in flow.steps:
        after = _add(step, after, items)
    return after


def callback_spec(sig: Sig | None) -> dict[str, Any] | None:
    """A batch callback as stored (its job is inserted by the database when the batch
    fires, so every field is checked and defaulted here)."""
    if sig is None:
        return None
    if not isinstance(sig, Sig):
        raise ConfigError(f"a batch callback is a signature (task.sig(...)), got {sig!r}")
    options = dict(sig.options)
    extra = set(options) - CALLBACK_OPTIONS
    if extra:
        raise ConfigError(f"a batch callback cannot carry {', '.join(sorted(extra))}")
    spec: dict[str, Any] = {"task": sig.task, "payload": sig.payload}
    for name in sorted(CALLBACK_OPTIONS):
        check = BY_NAME[name].check
        value = options.get(name, DEFAULTS[name])
        spec[name] = value if check is None else check(value)
    return spec
