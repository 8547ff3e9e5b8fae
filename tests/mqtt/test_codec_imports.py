"""The codec is sans-I/O: it imports the standard library, `riverbed.errors` and
`riverbed.topics`, and nothing else (no asyncio, sockets, clocks or storage)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import riverbed.mqtt.codec

CODEC = Path(riverbed.mqtt.codec.__file__).parent
ALLOWED_RIVERBED = ("riverbed.errors", "riverbed.topics", "riverbed.mqtt.codec")
IO_MODULES = {"asyncio", "socket", "selectors", "ssl", "threading", "time", "sqlite3"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_codec_imports_only_the_standard_library_errors_and_topics() -> None:
    modules = sorted(CODEC.glob("*.py"))
    assert len(modules) >= 5
    for path in modules:
        for name in imported_modules(path):
            top = name.partition(".")[0]
            if top == "riverbed":
                assert name.startswith(ALLOWED_RIVERBED), f"{path.name} imports {name}"
            else:
                assert top in sys.stdlib_module_names, f"{path.name} imports {name}"
                assert top not in IO_MODULES, f"{path.name} imports {name}: no I/O in the codec"
