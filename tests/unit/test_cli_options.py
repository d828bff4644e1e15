"""The command line's parsing, without a database: which settings win, and the worker's
options as a mirror of WorkerConfig."""

from __future__ import annotations

import dataclasses
import os

import pytest

from leaseq.app import App
from leaseq.cli import cli
from leaseq.cli.settings import Settings
from leaseq.cli.worker import bind_app, config_from_options, worker
from leaseq.worker import QueueSettings, WorkerConfig

APP = "tests.support.apps.basic:app"


def _settings(*args: str) -> Settings:
    return Settings.from_context(cli.make_context("leaseq", [*args, "worker", APP]))


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], None, "app_schema"),
        (["--schema", "leaseq"], None, "leaseq"),  # equal to the default, still given
        (["--schema", "other"], None, "other"),
        ([], "leaseq", "leaseq"),
    ],
)
def test_given_schema_beats_the_apps_even_when_it_equals_the_default(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: str | None, expected: str
) -> None:
    monkeypatch.delenv("LEASEQ_SCHEMA", raising=False)
    if env is not None:
        monkeypatch.setenv("LEASEQ_SCHEMA", env)
    app = App(schema="app_schema")
    bind_app(app, _settings(*args))
    assert app.schema == expected


def _parsed(*args: str) -> WorkerConfig:
    params = worker.make_context("worker", [APP, *args]).params
    for cli_only in ("app_ref", "queues", "any_queue", "processes"):
        params.pop(cli_only)
    return config_from_options((QueueSettings("default"),), params)


def test_every_worker_setting_is_an_option_with_the_dataclass_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("LEASEQ_WORKER_"):
            monkeypatch.delenv(name)
    parsed = _parsed()
    assert dataclasses.replace(parsed, worker_id="w") == WorkerConfig(worker_id="w")
    options = {o for p in worker.params for o in getattr(p, "opts", [])}
    for spec in dataclasses.fields(WorkerConfig):
        if spec.metadata["option"]:
            negated = spec.metadata["kind"] == "negated_flag"
            flag = ("--no-" if negated else "--") + spec.name.replace("_", "-")
            assert flag in options, flag


def test_worker_options_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEQ_WORKER_PREFETCH", "3")
    config = _parsed(
        "-c", "7", "--retention", "never", "--priority-aging", "30s", "--no-listen",
        "--worker-id", "me", "--prune-interval", "2m",
    )  # fmt: skip
    assert (config.concurrency, config.prefetch, config.retention) == (7, 3, None)
    assert (config.priority_aging, config.prune_interval) == (30.0, 120.0)
    assert (config.listen, config.worker_id) == (False, "me")
    assert _parsed("--retention", "1d").retention == 86400.0
