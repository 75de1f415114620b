"""The engine package's modules import one another one way: no import cycle.

Every intra-package import counts, wherever it is written (module top level, inside a
function, under ``if TYPE_CHECKING:``), so a cycle cannot hide behind a deferred import.
"""

from __future__ import annotations

import ast
import asyncio
import gc
from pathlib import Path

import dex_dev_server

PACKAGE = "dex_dev_server"
PACKAGE_DIR = Path(dex_dev_server.__file__).resolve().parent


def _module_name(path: Path) -> str:
    return "__init__" if path.stem == "__init__" else path.stem


def _parse(path: Path) -> ast.Module:
    """``ast.parse`` with the cyclic garbage collector paused.

    On CPython 3.11 a collection that runs during the AST's construction can run a finalizer
    that parses too (asyncio logging a failed task formats its traceback, which parses the
    source lines); the nested parse resets the constructor's shared recursion counter and the
    outer one fails with "SystemError: AST constructor recursion depth mismatch" (a CI run of
    this test failed so; see python/cpython#106905 for the counter).
    """
    source = path.read_text()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=str(path))
    finally:
        if was_enabled:
            gc.enable()


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """``{module: modules of the same package it imports}`` for every ``.py`` file.

    Modules are named by file stem (``__init__`` for the package itself). ``from . import x``
    counts as an import of module ``x`` when ``x.py`` exists, else of ``__init__``.
    """
    modules = {_module_name(p) for p in package_dir.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(package_dir.glob("*.py")):
        tree = _parse(path)
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    parts = (node.module or "").split(".")
                    if parts[0] != PACKAGE:
                        continue
                    target = parts[1] if len(parts) > 1 else None
                elif node.level == 1:
                    target = (node.module or "").split(".")[0] or None
                else:
                    continue
                if target is None:
                    edges.update(
                        a.name if a.name in modules else "__init__" for a in node.names
                    )
                else:
                    edges.add(target)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == PACKAGE:
                        edges.add(parts[1] if len(parts) > 1 else "__init__")
        me = _module_name(path)
        graph[me] = {e for e in edges if e in modules and e != me}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or ``None`` when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found is not None:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found is not None:
                return found
    return None


def test_the_engine_package_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE_DIR)
    assert "_service" in graph and "_state" in graph, sorted(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in dex_dev_server: " + " -> ".join(cycle or [])


def test_deferred_and_type_checking_imports_count(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "_a.py").write_text("from ._b import thing\n")
    (tmp_path / "_b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ._c import Other\n"
        "thing = 1\n"
    )
    (tmp_path / "_c.py").write_text("def f() -> None:\n    from . import _a\n")
    graph = import_graph(tmp_path)
    assert graph["_a"] == {"_b"} and graph["_b"] == {"_c"} and graph["_c"] == {"_a"}
    assert find_cycle(graph) == ["_a", "_b", "_c", "_a"]
    (tmp_path / "_c.py").write_text("def f() -> None:\n    pass\n")
    assert find_cycle(import_graph(tmp_path)) is None


def test_the_graph_is_read_while_failed_tasks_wait_for_the_collector() -> None:
    """Failed asyncio tasks in reference cycles, as a fixture that errored can leave: when a
    collection frees them during a parse, asyncio logs their tracebacks, which parses too."""

    async def fail() -> None:
        raise RuntimeError("left for the garbage collector")

    loop = asyncio.new_event_loop()
    try:
        for _ in range(10):
            for _ in range(5):
                task = loop.create_task(fail())
                loop.run_until_complete(asyncio.sleep(0))
                task.cycle = task  # type: ignore[attr-defined]  # freed by the collector only
            del task
            assert "_state" in import_graph(PACKAGE_DIR)
    finally:
        loop.close()
        gc.collect()
