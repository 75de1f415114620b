"""The pages' ES modules: the shared ones tested with Node's own test runner (``node --test``),
and every module's imports checked against what the imported module exports.

The ``.mjs`` tests live in ``tests/agents_app/pages/js/`` and import the modules the browser
loads from ``agents_app/static/agents_app/``; this wrapper lets ``make test`` run them. The page
modules touch the DOM when they load, so Node cannot load them; their imports are read from the
source instead: a name imported that its module does not export, or modules that import one
another in a circle, would only show in a browser.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

JS_TESTS = Path(__file__).resolve().parent / "js"
MODULES = Path(__file__).resolve().parents[3] / "agents_app" / "static" / "agents_app"

#: ``import { a, b as c } from "./x.mjs";`` (the braces may span lines) and ``import "./x.mjs";``.
IMPORT = re.compile(r'^import\s+(?:\{(?P<names>[^}]*)\}\s*from\s*)?"\./(?P<module>[\w.]+\.mjs)";',
                    re.MULTILINE)
#: ``export function f``, ``export async function f``, ``export const C``, ``export class K``.
EXPORT = re.compile(r"^export\s+(?:async\s+)?(?:function\*?|const|let|class)\s+(?P<name>[\w$]+)",
                    re.MULTILINE)


def test_shared_es_modules_pass_their_node_tests() -> None:
    node = shutil.which("node")
    assert node, "Node.js 18 or newer tests the pages' ES modules: apt-get install nodejs"
    tests = sorted(str(path) for path in JS_TESTS.glob("*.test.mjs"))
    assert tests, f"no *.test.mjs files under {JS_TESTS}"
    done = subprocess.run(
        [node, "--test", *tests], capture_output=True, text=True, timeout=120, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "# fail 0" in output, output


def _imports(source: str) -> dict[str, set[str]]:
    """``{module file name: names imported from it}`` of one module's relative imports."""
    found: dict[str, set[str]] = {}
    matches = list(IMPORT.finditer(source))
    # Every relative import is one this test reads (none in a form the pattern misses).
    assert len(matches) == len(re.findall(r'(?:from|import)\s*["\']\./', source)), source[:200]
    for match in matches:
        names = {part.split(" as ")[0].strip() for part in (match["names"] or "").split(",")}
        found.setdefault(match["module"], set()).update(name for name in names if name)
    return found


def test_page_modules_import_only_what_exists_and_one_way() -> None:
    sources = {path.name: path.read_text() for path in sorted(MODULES.glob("*.mjs"))}
    assert "chat.mjs" in sources, sorted(sources)
    exports = {name: {m["name"] for m in EXPORT.finditer(text)} for name, text in sources.items()}
    graph = {name: _imports(text) for name, text in sources.items()}
    missing = [
        f"{name} imports {sorted(wanted - exports.get(target, set()))} from {target}"
        for name, imports in graph.items()
        for target, wanted in imports.items()
        if target not in exports or wanted - exports[target]
    ]
    assert not missing, missing

    # Depth-first search for a module that reaches itself through its imports.
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            circle = " -> ".join([*path, name])
            raise AssertionError(f"modules import one another in a circle: {circle}")
        if name in done:
            return
        for target in graph[name]:
            visit(target, [*path, name])
        done.add(name)

    for name in graph:
        visit(name, [])
