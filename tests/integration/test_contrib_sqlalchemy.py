"""leaseq.contrib.sqlalchemy on a real PostgreSQL (psycopg 3 dialect, sync and async): a
job enqueued through ``connection_for(session)`` exists, and wakes a listener, only if the
session's transaction commits; a rolled-back savepoint takes its job with it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, String, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import leaseq
from leaseq.contrib.sqlalchemy import async_connection_for, connection_for
from leaseq.testing import Kit


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(100))


@pytest.fixture()
def engine(leaseq_dsn: str) -> Iterator[Engine]:
    eng = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(leaseq_dsn))
    Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


@pytest.fixture()
async def async_engine(leaseq_dsn: str, engine: Engine) -> AsyncIterator[AsyncEngine]:
    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(leaseq_dsn)

    eng = create_async_engine("postgresql+psycopg://", async_creator=connect)
    yield eng
    await eng.dispose()


@pytest.fixture()
def listener(leaseq_dsn: str, leaseq_client: leaseq.Client) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(leaseq_dsn, autocommit=True) as conn:
        conn.execute(f'LISTEN "{leaseq_client.channel}"')
        yield conn


def next_wakeup(listener: psycopg.Connection[Any]) -> str:
    """The queue named by the next NOTIFY (waits for it)."""
    for note in listener.notifies(timeout=10, stop_after=1):
        return note.payload
    raise AssertionError("no wake-up arrived")


def test_commit_stores_the_job_with_the_row_and_wakes_workers(
    engine: Engine, leaseq_testing: Kit, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        session.add(Order(id=1, email="a@example.com"))
        conn = connection_for(session)
        leaseq_testing.client.enqueue("mail.receipt", {"order": 1}, queue="mail", connection=conn)
        # leaseq joined the session's transaction and left it open.
        assert not conn.autocommit
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        leaseq_testing.refute_enqueued("mail.receipt")  # not visible before the commit
        session.commit()
    leaseq_testing.assert_enqueued("mail.receipt", payload_subset={"order": 1}, queue="mail")
    assert next_wakeup(listener) == "mail"


def test_rollback_leaves_no_job_and_wakes_nobody(
    engine: Engine, leaseq_testing: Kit, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        session.add(Order(id=2, email="b@example.com"))
        leaseq_testing.client.enqueue(
            "mail.receipt", {"order": 2}, queue="rolled-back", connection=connection_for(session)
        )
        session.rollback()
    leaseq_testing.refute_enqueued("mail.receipt")
    with Session(engine) as session:
        assert session.get(Order, 2) is None
    # A later committed enqueue's wake-up is the first to arrive: none came for the rollback.
    leaseq_testing.client.enqueue("mail.other", {}, queue="marker")
    assert next_wakeup(listener) == "marker"


def test_a_rolled_back_savepoint_takes_its_job_with_it(engine: Engine, leaseq_testing: Kit) -> None:
    client = leaseq_testing.client
    with Session(engine) as session:
        client.enqueue("mail.kept", {}, connection=connection_for(session))
        nested = session.begin_nested()
        client.enqueue("mail.dropped", {}, connection=connection_for(session))
        nested.rollback()
        session.commit()
    leaseq_testing.assert_enqueued("mail.kept")
    leaseq_testing.refute_enqueued("mail.dropped")


async def test_async_session_commit_and_rollback(
    async_engine: AsyncEngine, leaseq_dsn: str, leaseq_testing: Kit
) -> None:
    async with leaseq.AsyncClient(leaseq_dsn) as client:
        async with AsyncSession(async_engine) as session:
            session.add(Order(id=3, email="c@example.com"))
            conn = await async_connection_for(session)
            await client.enqueue("mail.receipt", {"order": 3}, connection=conn)
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            await session.commit()
        async with AsyncSession(async_engine) as session:
            conn = await async_connection_for(session)
            await client.enqueue("mail.receipt", {"order": 4}, connection=conn)
            await session.rollback()
    leaseq_testing.assert_enqueued("mail.receipt", payload_subset={"order": 3})
    leaseq_testing.refute_enqueued("mail.receipt", payload_subset={"order": 4})


def test_sync_use_imports_and_works_without_greenlet(leaseq_dsn: str) -> None:
    """SQLAlchemy 2.1 no longer installs greenlet, and ``sqlalchemy.ext.asyncio`` refuses to
    import without it: the sync half of the integration must not need it (issue 30)."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "sys.modules['greenlet'] = None  # as if it were not installed\n"
        "import psycopg\n"
        "from sqlalchemy import create_engine\n"
        "from sqlalchemy.orm import Session\n"
        "import leaseq\n"
        "from leaseq.contrib.sqlalchemy import connection_for\n"
        "assert 'sqlalchemy.ext.asyncio' not in sys.modules\n"
        f"dsn = {leaseq_dsn!r}\n"
        "eng = create_engine('postgresql+psycopg://', creator=lambda: psycopg.connect(dsn))\n"
        "client = leaseq.Client(dsn)\n"
        "with Session(eng) as s, s.begin():\n"
        "    client.enqueue('mail.send', {}, connection=connection_for(s))\n"
        "print(client.queue_stats()[0].ready)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
