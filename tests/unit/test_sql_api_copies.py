"""The SQL API's copies of the client's statements (migration 0020 and later refreshes,
and schema.sql) equal the statements in leaseq/sql/queries/: tools/sql_api_refresh.py
--check. A statement changed without a refresh migration fails here, naming it."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
from types import ModuleType

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "sql_api_refresh.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sql_api_refresh", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sql_api_refresh", module)
    spec.loader.exec_module(module)
    return module


def test_every_copy_equals_its_statement() -> None:
    tool = _tool()
    definitions = tool.latest_definitions()
    assert {"enqueue", "enqueue_many", "cancel", "job_result", "_api_insert"} <= set(definitions)
    copied = {m.group(1) for _, text in definitions.values() for m in tool._BLOCK_RE.finditer(text)}
    assert {"insert_job", "insert_unique_job", "cancel_job", "promote_dependents"} <= copied
    assert tool.problems() == []


def test_a_changed_statement_is_found() -> None:
    tool = _tool()
    _, text = tool.latest_definitions()["_api_insert"]
    changed = text.replace("INSERT INTO {schema}.jobs", "INSERT INTO {schema}.jobz", 1)
    assert changed != text and tool.stale(changed)
    assert tool.stale(tool.fill(changed)) == []


def test_every_parameter_of_a_copy_is_declared_in_its_function() -> None:
    """A copy's %(NAME)s became p_NAME: the function must declare it (or plpgsql would
    fail only when that branch first runs)."""
    tool = _tool()
    missing = []
    for function, (_, text) in tool.latest_definitions().items():
        declared = set(re.findall(r"^\s+(p_\w+) ", text, re.MULTILINE))
        declared |= set(re.findall(r"\b(p_\w+) \w+(?:\[\])?[,)]", text.split("\n", 1)[0]))
        for m in tool._BLOCK_RE.finditer(text):
            for name in tool.statement_params(m.group(1)):
                if name not in declared:
                    missing.append(f"{function}: {name} (statement {m.group(1)})")
    assert not missing
