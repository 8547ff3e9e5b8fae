"""The mqtt package is layered: its modules import each other in no circle, and
none reaches into another object's private members (docs/architecture.md, "The
mqtt package"; `lint-imports` keeps the order of the layers themselves).

Imports are read from the source, those under `if TYPE_CHECKING:` included: an
annotation that names a module above is a dependency on it all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import riverbed

SRC = Path(riverbed.__file__).parent

PRIVATE_REACH_ALLOWED = {
    # Stopping took longer than `limits.stop_grace`: the process ends at once.
    ("broker.py", "os._exit"),
    # wsproto says nowhere in public whether it holds part of a frame
    # (`_wsproto_idle`; tests/mqtt/test_websocket.py checks its internals).
    ("websocket.py", "proto._frame_decoder"),
    ("websocket.py", "proto._message_decoder"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports(path: Path) -> set[str]:
    """The riverbed modules a file imports outside functions (in `if` blocks too)."""
    names: set[str] = set()
    body = list(ast.parse(path.read_text(), str(path)).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If | ast.Try):
            body.extend(node.body)
            body.extend(node.orelse)
            body.extend(getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                body.extend(handler.body)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.startswith("riverbed.")}


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (a package stands for its `__init__`)."""
    modules = {module_name(path): path for path in package.rglob("*.py")}
    return {
        name: {imported for imported in module_level_imports(path) if imported in modules} - {name}
        for name, path in modules.items()
    }


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph, or None (depth first, in sorted order)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for imported in sorted(graph[name]):
            if state.get(imported) == 1:
                return [*path[path.index(imported) :], imported]
            if imported not in state:
                circle = visit(imported)
                if circle is not None:
                    return circle
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            circle = visit(name)
            if circle is not None:
                return circle
    return None


def test_find_circle_finds_one_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_circle(graph) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None


def test_type_checking_imports_are_read(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "from riverbed.mqtt import codec\n"
        "if TYPE_CHECKING:\n"
        "    from riverbed.mqtt.broker import Broker\n"
        "def later():\n"
        "    import riverbed.cli\n"
    )
    assert module_level_imports(module) == {
        "riverbed.mqtt",
        "riverbed.mqtt.codec",
        "riverbed.mqtt.broker",
        "riverbed.mqtt.broker.Broker",
    }


def test_the_mqtt_modules_import_each_other_in_no_circle() -> None:
    graph = import_graph(SRC / "mqtt")
    assert len(graph) > 20
    assert "riverbed.mqtt.connection" in graph["riverbed.mqtt.broker"]
    assert find_circle(graph) is None, " -> ".join(find_circle(graph) or [])


def test_the_http_modules_import_each_other_in_no_circle() -> None:
    graph = import_graph(SRC / "http")
    assert "riverbed.http.jobs" in graph["riverbed.http.context"]
    assert find_circle(graph) is None, " -> ".join(find_circle(graph) or [])


def test_no_mqtt_module_reaches_into_private_members_of_other_objects() -> None:
    reaches: set[tuple[str, str]] = set()
    for path in sorted((SRC / "mqtt").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                reaches.add((path.name, ast.unparse(node)))
    assert reaches <= PRIVATE_REACH_ALLOWED, sorted(reaches - PRIVATE_REACH_ALLOWED)
