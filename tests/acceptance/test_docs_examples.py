"""The docs as a newcomer pastes them (issue 30): every python and sh example of README.md
and docs/*.md runs (the forms: tests/support/docs_examples.py), each page in a fresh
virtual environment holding only what its own ``pip install`` line names, installed from
the checkout's wheel (non-editable, built once per session), against a fresh database of
the real test server. And each extra, installed alone, imports.

Bounded: one environment per distinct ``pip install`` line (shared by the pages and the
extras that name the same), the page's snippets in one interpreter, each step timed out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.docs_examples import (
    HOW_TO_FIX,
    ROOT,
    Block,
    blocks,
    pages,
    wheel_requirements,
    without_pip_lines,
)

pytestmark = pytest.mark.slow  # environments are installed, example projects run

RUNNER = ROOT / "tests" / "support" / "docs_runner.py"
STEP_TIMEOUT = 180
CORE = ("leaseq",)


class Environments:
    """Virtual environments by what was installed in them, made on first use."""

    def __init__(self, base: Path, wheel: Path) -> None:
        self.base, self.wheel, self.made = base, wheel, dict[tuple[str, ...], Path]()

    def get(self, requirements: tuple[str, ...]) -> Path:
        if requirements not in self.made:
            venv = self.base / f"venv{len(self.made)}"
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            install = [str(venv / "bin" / "pip"), "install", "-q", "--no-input"]
            done = subprocess.run(
                [*install, *wheel_requirements(requirements, self.wheel)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, f"pip install {' '.join(requirements)}:\n{done.stderr}"
            self.made[requirements] = venv
        return self.made[requirements]


@pytest.fixture(scope="module")
def environments(tmp_path_factory: pytest.TempPathFactory) -> Environments:
    base = tmp_path_factory.mktemp("docs-envs")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(base), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = base.glob("leaseq-*.whl")
    return Environments(base, wheel)


@pytest.fixture()
def page_database(dsn: str) -> Iterator[str]:
    """A fresh, empty database for one page (its examples migrate it themselves)."""
    name = f"docs_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield make_conninfo(dsn, dbname=name)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def environ_for(venv: Path, page_dsn: str, server_dsn: str) -> dict[str, str]:
    params = conninfo_to_dict(page_dsn)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEASEQ_", "PG"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        LEASEQ_DSN=page_dsn,
        # The testing kit's server, for a page whose example project has its own tests.
        LEASEQ_TEST_DSN=server_dsn,
        PGHOST=str(params.get("host", "")),
        PGPORT=str(params.get("port", "")),
        PGUSER=str(params.get("user", "")),
        PGDATABASE=str(params["dbname"]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    if params.get("password"):
        env["PGPASSWORD"] = str(params["password"])
    return env


def page_requirements(found: list[Block]) -> tuple[str, ...]:
    return next((b.requirements for b in found if b.requirements), None) or CORE


class Snippets:
    """The page's one interpreter, started at its first snippet."""

    def __init__(self, venv: Path, cwd: Path, env: dict[str, str]) -> None:
        # stderr to a file: a chatty snippet must not block on a full pipe.
        self.errors = tempfile.TemporaryFile("w+")  # noqa: SIM115  (closed by close())
        self.proc = subprocess.Popen(
            [str(venv / "bin" / "python"), "-c", _BOOT, str(RUNNER)],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
        )

    def run(self, block: Block) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"code": block.code, "where": block.where}) + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "ok":
            self.proc.wait(timeout=STEP_TIMEOUT)
            self.errors.seek(0)
            pytest.fail(f"{block.where} failed:\n{self.errors.read()}\n{HOW_TO_FIX}")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=STEP_TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.errors.close()


# As `python` started in the project directory: the directory is importable.
_BOOT = (
    "import runpy, sys; sys.path.insert(0, ''); runpy.run_path(sys.argv[1], run_name='__main__')"
)


def run_page(page: Path, environments: Environments, page_dsn: str, server_dsn: str,
             project: Path) -> int:  # fmt: skip
    found = [b for b in blocks(page) if b.not_runnable is None]
    venv = environments.get(page_requirements(found))
    env = environ_for(venv, page_dsn, server_dsn)
    snippets: Snippets | None = None
    try:
        for block in found:
            if block.path is not None:
                target = project / block.path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.code, "utf-8")
            elif block.lang == "python":
                snippets = snippets or Snippets(venv, project, env)
                snippets.run(block)
            else:
                done = subprocess.run(
                    ["bash", "-e", "-o", "pipefail", "-c", without_pip_lines(block.code)],
                    cwd=project,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=STEP_TIMEOUT,
                )
                if done.returncode != 0:
                    pytest.fail(
                        f"{block.where} exited {done.returncode}:\n{done.stdout}\n"
                        f"{done.stderr}\n{HOW_TO_FIX}"
                    )
    finally:
        if snippets is not None:
            snippets.close()
    return len(found)


RUNNABLE_PAGES = [p for p in pages() if any(b.not_runnable is None for b in blocks(p))]


@pytest.mark.timeout(900)  # an environment to install, then a whole example project
@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=lambda p: p.name)
def test_every_example_of_the_page_runs_as_pasted(
    page: Path,
    environments: Environments,
    page_database: str,
    dsn: str,
    tmp_path: Path,
) -> None:
    assert run_page(page, environments, page_database, dsn, tmp_path) > 0


#: Each extra alone, and what a user of it imports first.
EXTRAS = {
    "sqlalchemy": "import leaseq.contrib.sqlalchemy, sqlalchemy.orm",
    "django": (
        "import django; from django.conf import settings; "
        "settings.configure(INSTALLED_APPS=['leaseq.contrib.django'], "
        "DATABASES={'default': {'ENGINE': 'django.db.backends.postgresql'}}); "
        "django.setup(); import leaseq.contrib.django.management.commands.leaseq"
    ),
    "starlette": "import leaseq.contrib.starlette",
    "otel": "from leaseq.contrib.otel import OpenTelemetryTracing; OpenTelemetryTracing()",
    "web": "from leaseq.web import create_app; import uvicorn, jinja2, multipart",
}


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_each_extra_installed_alone_imports(extra: str, environments: Environments) -> None:
    venv = environments.get((f"leaseq[{extra}]",))
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", EXTRAS[extra]],
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        cwd=venv,
    )
    assert done.returncode == 0, done.stderr
