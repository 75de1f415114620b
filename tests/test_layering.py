"""The project's packages import one another one way, and so do the modules of each package.

The allowed arrows between packages are written down once, in ``PACKAGE_ARROWS`` (and drawn in
docs/ARCHITECTURE.md, "Packages and imports"). Inside a package no module may reach itself
through imports. Every import counts, wherever it is written (module top level, inside a
function, under ``if TYPE_CHECKING:``), so a cycle cannot hide behind a deferred import.
Migrations are left out: Django loads them by name, nothing imports them.
"""

from __future__ import annotations

import ast
import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Each package and the packages it may import; none imports one above it.
#: dexagents_site (the Django project) -> agents_app (sessions, pages, API, worker side)
#: -> mcp_registry (MCP servers and their clients) and dex_agents (the session Flow);
#: dex_dev_server (the engine) stands alone: it speaks to the others only over gRPC.
PACKAGE_ARROWS: dict[str, frozenset[str]] = {
    "dexagents_site": frozenset({"agents_app", "mcp_registry", "dex_agents"}),
    "agents_app": frozenset({"mcp_registry", "dex_agents"}),
    "mcp_registry": frozenset(),
    "dex_agents": frozenset(),
    "dex_dev_server": frozenset(),
}

#: Inside ``agents_app``: its parts from the top down, each a package or a top-level module.
#: A module may import its own part and the parts of the layers below its own; across the
#: packages of one layer only the arrows in ``AGENTS_APP_SIBLING_ARROWS`` (the top-level modules of
#: one layer may import one another: the cycle test below keeps them one way).
#: docs/ARCHITECTURE.md ("Inside agents_app") draws the same layers; each package's ``__init__``
#: says what it owns.
AGENTS_APP_LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    # What Django and host projects load by name, and the kept flat paths (shims).
    (
        "wiring",
        frozenset({
            "apps", "admin", "urls", "signals", "tasks", "management",
            "apis", "api_schema", "api_pagination", "content_security", "kombu_filesystem",
            "ops_views", "page_urls", "lifespan", "routing", "demo_model",
        }),
    ),
    # The faces: REST API, pages, websockets and the live relay, the demo model, the dev stack.
    ("faces", frozenset({"api", "pages", "live", "demo", "dev"})),
    # Reads and writes of agents and sessions (HackSoft selectors and services).
    ("domain", frozenset({"selectors", "services"})),
    # The Django index of sessions and approvals, search, and the outbox of accepted writes.
    ("sessions", frozenset({"sessions"})),
    # The web side's door to the Dex engine, and its snapshot cache.
    ("gateway", frozenset({"gateway"})),
    # The Dex worker's side: the shared Flow, the LiteLLM runner, titles, heartbeats.
    ("worker", frozenset({"worker"})),
    # Usage, cost and budgets; notices (email, webhooks).
    ("support", frozenset({"usage", "notify"})),
    # Settings, models, auth, errors, metrics: importable from everywhere above.
    (
        "foundation",
        frozenset({
            "conf", "rates", "log_context", "models", "providers", "webhook_urls",
            "task_queue", "metrics", "rest_errors", "auth", "websocket_db",
            "trigger_templates",
            "schedule_times",
        }),
    ),
)
AGENTS_APP_SIBLING_ARROWS: frozenset[tuple[str, str]] = frozenset({
    ("pages", "api"),  # the usage page validates its range with the API's serializer
    ("api", "live"),  # the API's SSE and long-poll reads use the live relay
})

#: The MCP client's modules, lowest first (docs/ARCHITECTURE.md, "Packages and imports"): each
#: imports only those before it and ``mcp_registry.content``; ``mcp_registry.client`` is their
#: public face.
MCP_CLIENT_STACK = (
    "mcp_registry._mcp_spec",
    "mcp_registry._mcp_stdio",
    "mcp_registry._mcp_transport",
    "mcp_registry._mcp_connection",
    "mcp_registry._mcp_discovery",
    "mcp_registry._mcp_call",
    "mcp_registry._mcp_pool",
    "mcp_registry.client",
)


def _parse(path: Path) -> ast.Module:
    """``ast.parse`` with the cyclic garbage collector paused.

    On CPython 3.11 a collection that runs during the AST's construction can run a finalizer
    that parses too (asyncio logging a failed task formats its traceback, which parses the
    source lines); the nested parse resets the constructor's shared recursion counter and the
    outer one fails with "SystemError: AST constructor recursion depth mismatch" (a CI run of
    the engine's layering test failed so; see python/cpython#106905 for the counter).
    """
    source = path.read_text()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=str(path))
    finally:
        if was_enabled:
            gc.enable()


def _modules(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` of ``package`` under ``root``, migrations left out."""
    found: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if "migrations" in parts:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(tree: ast.Module, me: str, is_package: bool) -> Iterator[tuple[str, ...]]:
    """For each import in ``tree``, the dotted names it may refer to, most precise first;
    relative imports resolved against ``me`` (a package's ``__init__`` when ``is_package``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name,) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            yield from ((f"{module}.{alias.name}", module) for alias in node.names)


def import_graph(root: Path, packages: list[str]) -> dict[str, set[str]]:
    """``{module: the modules of ``packages`` it imports}``, dotted names.

    ``from pkg import x`` counts as an import of ``pkg.x`` when that is a module, else of
    ``pkg`` itself; ``import pkg.x.y`` as an import of the longest module it names.
    """
    modules: dict[str, Path] = {}
    for package in packages:
        modules.update(_modules(root, package))
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for candidates in _imports(_parse(path), name, path.stem == "__init__"):
            imported = next((c for c in candidates if c in modules), candidates[-1])
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The import cycles of ``graph``: its strongly connected parts of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                part.add(member)
                if member == node:
                    break
            if len(part) > 1:
                found.append(frozenset(part))

    for start in sorted(graph):
        if start not in index:
            visit(start)
    return found


def _cycle_text(graph: dict[str, set[str]], part: frozenset[str]) -> str:
    return "\n".join(
        f"  {module} -> {target}"
        for module in sorted(part)
        for target in sorted(graph[module] & part)
    )


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT, sorted(PACKAGE_ARROWS))


def test_packages_import_only_the_packages_below_them(graph: dict[str, set[str]]) -> None:
    assert {"agents_app.models", "dex_dev_server._service", "dex_agents._steps"} <= set(graph)
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if (mine := module.split(".")[0]) != (theirs := target.split(".")[0])
        and theirs not in PACKAGE_ARROWS[mine]
    )
    assert not wrong, "imports against PACKAGE_ARROWS:\n" + "\n".join(wrong)


def _agents_app_part(module: str) -> str:
    """The part of ``agents_app`` that ``module`` belongs to: its package or top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_agents_app_parts_import_only_their_layer_and_below(graph: dict[str, set[str]]) -> None:
    layer_of = {part: depth for depth, (_, parts) in enumerate(AGENTS_APP_LAYERS) for part in parts}
    layer_of["__init__"] = len(AGENTS_APP_LAYERS)  # the package's own face, imports nothing
    mine = {m: ts for m, ts in graph.items() if m.split(".")[0] == "agents_app"}
    unplaced = sorted({_agents_app_part(m) for m in mine} - set(layer_of))
    assert not unplaced, f"parts of agents_app in no layer of AGENTS_APP_LAYERS: {unplaced}"
    wrong = []
    for module, targets in mine.items():
        here = _agents_app_part(module)
        for target in targets:
            there = _agents_app_part(target)
            if target.split(".")[0] != "agents_app" or there == here:
                continue
            if layer_of[there] > layer_of[here]:
                continue
            if layer_of[there] == layer_of[here] and (
                (here, there) in AGENTS_APP_SIBLING_ARROWS
                or module.count(".") == target.count(".") == 1  # top-level modules of one layer
            ):
                continue
            wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against AGENTS_APP_LAYERS:\n" + "\n".join(sorted(wrong))


@pytest.mark.parametrize("package", sorted(PACKAGE_ARROWS))
def test_no_import_cycle_in_the_package(graph: dict[str, set[str]], package: str) -> None:
    mine = {
        module: {target for target in targets if target.split(".")[0] == package}
        for module, targets in graph.items()
        if module.split(".")[0] == package
    }
    cycles = strongly_connected(mine)
    assert not cycles, f"import cycles in {package}:\n" + "\n\n".join(
        _cycle_text(mine, part) for part in cycles
    )


def test_the_mcp_client_modules_import_downwards(graph: dict[str, set[str]]) -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for position, module in enumerate(MCP_CLIENT_STACK)
        for target in graph[module]
        if target not in {*MCP_CLIENT_STACK[:position], "mcp_registry.content"}
    )
    assert not wrong, "imports against MCP_CLIENT_STACK:\n" + "\n".join(wrong)
    assert graph["mcp_registry.content"].isdisjoint(MCP_CLIENT_STACK)


def test_deferred_relative_and_type_checking_imports_count(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..c import Other\n"
        "thing = 1\n"
    )
    (package / "c.py").write_text("def f() -> None:\n    import pkg.a\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert strongly_connected(graph) == [frozenset({"pkg.a", "pkg.sub.b", "pkg.c"})]
    (package / "c.py").write_text("def f() -> None:\n    pass\n")
    assert strongly_connected(import_graph(tmp_path, ["pkg"])) == []


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
            assert "dex_dev_server._state" in import_graph(ROOT, ["dex_dev_server"])
    finally:
        loop.close()
        gc.collect()
