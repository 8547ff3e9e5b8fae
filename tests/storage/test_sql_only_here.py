"""SQL is written in `riverbed.storage` alone (docs/architecture.md, "Layers and
packages"): the packages above it call the storage's operations, inside a
transaction where they must commit together (`storage/transactions.py`).
`lint-imports` keeps the database drivers there; this keeps the statements.

The bus between broker nodes is the one exception: it talks LISTEN/NOTIFY on a
PostgreSQL connection of its own (`riverbed.cluster`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import riverbed

SRC = Path(riverbed.__file__).parent

ALLOWED = ("storage/", "cluster/")
"""Paths under src/riverbed/ whose files may hold SQL."""

STATEMENT = re.compile(
    r"\s*(SELECT\s|INSERT\s+INTO\s|UPDATE\s+\w+\s+SET\s|DELETE\s+FROM\s|(RELEASE\s+)?SAVEPOINT\s"
    r"|ROLLBACK\b|BEGIN\b|COMMIT\b|(CREATE|DROP|ALTER)\s+(TABLE|INDEX)\s|PRAGMA\s|LISTEN\s"
    r"|NOTIFY\s|SET\s+LOCAL\s)"
)
"""The start of an SQL statement, as Riverbed writes them (keywords in capitals)."""


def sql_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal (f-string parts included) that starts
    like an SQL statement."""
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and STATEMENT.match(node.value)
    )


def test_sql_strings_finds_statements_and_passes_over_prose() -> None:
    source = (
        '"""DELETE /api/v1/topics/{name} deletes a topic; SELECT a row."""\n'
        'tx.execute("DELETE FROM markers WHERE marker = ?", (marker,))\n'
        'tx.execute(f"SELECT value FROM {table} WHERE key = ?", (key,))\n'
        'tx.execute("SAVEPOINT riverbed_batch")\n'
        'message = "Update the topic first"\n'
    )
    assert [line for line, _ in sql_strings(source)] == [2, 3, 4]


def test_no_sql_outside_the_storage() -> None:
    found = {
        f"{path.relative_to(SRC)}:{line}": text
        for path in sorted(SRC.rglob("*.py"))
        if not str(path.relative_to(SRC)).startswith(ALLOWED)
        for line, text in sql_strings(path.read_text())
    }
    assert len(list(SRC.rglob("*.py"))) > 100  # the tree was found
    assert found == {}
