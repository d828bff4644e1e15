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


@pytest.mark.parametrize("name", ["LEASEQ_WORKER_QUEUE", "LEASEQ_WORKER_QUEUES"])
def test_queues_from_the_environment_by_the_documented_rule_space_separated(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Issue 30: LEASEQ_WORKER_<OPTION> for --queue is LEASEQ_WORKER_QUEUE; both spellings
    are read, space-separated."""
    for other in ("LEASEQ_WORKER_QUEUE", "LEASEQ_WORKER_QUEUES"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, "mail reports=2")
    assert worker.make_context("worker", [APP]).params["queues"] == ("mail", "reports=2")


def test_a_worker_variable_naming_no_option_is_refused_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from leaseq.cli import main

    monkeypatch.setenv("LEASEQ_WORKER_CONCURENCY", "20")
    with pytest.raises(SystemExit) as stopped:
        main(["worker", APP])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "LEASEQ_WORKER_CONCURENCY is not a worker setting" in err
    assert "did you mean LEASEQ_WORKER_CONCURRENCY?" in err
