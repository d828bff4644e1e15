"""Queues on several databases, the pure part: which database each queue lives on.

A :class:`QueueMap` sends named queues to their own PostgreSQL (``{"emails": dsn_b}``) and
every other queue to the default DSN (``default=``; None: ``LEASEQ_DSN``, as a client
without a DSN). Each database is an ordinary leaseq database, migrated on its own; a job,
its id, its dependencies, its batch, its unique key and its limits live in the database
of its queue. ``leaseq.routed_async`` routes a client's calls by this map, and
``leaseq worker --queue-dsn QUEUE=DSN`` runs one worker per database in one process.

Whatever would have to span databases is refused before anything is stored:
:func:`one_database` names the offending queues in one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from leaseq import validate
from leaseq.dsn import describe_dsn
from leaseq.errors import ConfigError
from leaseq.rules.deps import Dep
from leaseq.rules.unique import EnqueueResult


class QueueMap:
    """Queue name -> DSN, with a default for every queue not named."""

    def __init__(self, routes: Mapping[str, str] | None = None, *, default: str | None = None):
        self.routes: dict[str, str] = {}
        for queue, dsn in (routes or {}).items():
            validate.check_name("queue", queue)
            if not isinstance(dsn, str) or not dsn.strip():
                raise ConfigError(f"queue {queue!r}: the DSN is empty")
            describe_dsn(dsn)  # not a connection string: one line now, not at first use
            self.routes[queue] = dsn.strip()
        self.default = default.strip() if default and default.strip() else None

    @classmethod
    def parse(cls, specs: Iterable[str], *, default: str | None = None) -> QueueMap:
        """From ``QUEUE=DSN`` strings (``leaseq worker --queue-dsn``); a queue given twice,
        or a spec without ``=``, is a one-line error."""
        routes: dict[str, str] = {}
        for spec in specs:
            queue, sep, dsn = spec.partition("=")
            queue = queue.strip()
            if not sep or not queue or not dsn.strip():
                # Only the queue part is echoed: the DSN may hold a password.
                raise ConfigError(
                    f"expected QUEUE=DSN (e.g. emails=postgresql://...), got {queue!r}"
                )
            if queue in routes:
                raise ConfigError(f"queue {queue!r} is mapped to a database twice")
            routes[queue] = dsn
        return cls(routes, default=default)

    def dsn_for(self, queue: str) -> str | None:
        """The DSN of ``queue``'s database (None: the default, ``LEASEQ_DSN``)."""
        return self.routes.get(queue, self.default)

    def databases(self) -> list[str | None]:
        """Every database the map names, the default first, each once."""
        found: list[str | None] = [self.default]
        for dsn in self.routes.values():
            if dsn not in found:
                found.append(dsn)
        return found

    def split(self, queues: Iterable[str]) -> dict[str | None, list[str]]:
        """``queues`` grouped by database, in the order given."""
        groups: dict[str | None, list[str]] = {}
        for queue in queues:
            groups.setdefault(self.dsn_for(queue), []).append(queue)
        return groups

    def where(self, dsn: str | None) -> str:
        """A database as messages show it (never with its password)."""
        return "the default database" if dsn is None else describe_dsn(dsn)

    def __repr__(self) -> str:
        shown = {q: describe_dsn(d) for q, d in self.routes.items()}
        return f"QueueMap({shown}, default={self.where(self.default)!r})"


def one_database(queue_map: QueueMap, queues: Iterable[str], what: str) -> str | None:
    """The one database all ``queues`` live on; a one-line ConfigError naming two queues on
    different databases when they do not (``what``: the call that would span them)."""
    groups = queue_map.split(queues)
    if len(groups) > 1:
        (a, qa), (b, qb) = list(groups.items())[:2]
        raise ConfigError(
            f"{what} cannot span databases: queue {qa[0]!r} is on {queue_map.where(a)}, "
            f"queue {qb[0]!r} on {queue_map.where(b)}; nothing was stored"
        )
    return next(iter(groups), queue_map.default)


class RoutedResult(EnqueueResult):
    """What a routed enqueue returns: the job's id (an ``int``, as ever) and the database
    it is in (``database``: its DSN, None for the default), so that a dependency on it from
    a job of another database is refused instead of naming an unrelated job there."""

    database: str | None = None

    @classmethod
    def of(cls, result: EnqueueResult, database: str | None) -> RoutedResult:
        routed = int.__new__(cls, int(result))
        routed.__dict__.update(vars(result))
        routed.database = database
        return routed


def check_dependencies(
    queue_map: QueueMap, queue: str, depends_on: Iterable[object] | None
) -> None:
    """Refuse a dependency this router enqueued on another database than ``queue``'s.
    Plain ids carry no database: they are taken as jobs of ``queue``'s database."""
    home = queue_map.dsn_for(queue)
    for dep in depends_on or ():
        target = dep.target if isinstance(dep, Dep) else dep
        if isinstance(target, RoutedResult) and target.database != home:
            raise ConfigError(
                f"job {int(target)} is on {queue_map.where(target.database)} and queue "
                f"{queue!r} on {queue_map.where(home)}: dependencies cannot span databases; "
                "nothing was stored"
            )
