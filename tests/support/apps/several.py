"""An app whose queues live on two databases (``tests/acceptance/test_several_databases.py``):
``default`` on the app's DSN, ``emails`` wherever ``--queue-dsn emails=DSN`` (or
``App(queues=...)``) puts it. A ``hello`` job enqueues a ``mail`` job from its handler, so a
test sees that a handler's enqueue goes to the database of the queue it names."""

from __future__ import annotations

from typing import Any

import leaseq

app = leaseq.App()


@app.task(name="mail", queue="emails")
def mail(ctx: leaseq.JobContext, payload: Any) -> None:
    pass


@app.task(name="noop")
def noop(ctx: leaseq.JobContext, payload: Any) -> None:
    pass


@app.task(name="hello")
def hello(ctx: leaseq.JobContext, payload: Any) -> None:
    mail.enqueue({"for": ctx.job_id})


app.schedule("mail-digest", task=mail, every=3600)
