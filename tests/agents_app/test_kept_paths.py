"""The flat module paths host projects named before ``agents_app`` had packages still import,
and give the very objects of the modules that now hold them (docs/install-as-app.md)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

KEPT = [
    ("agents_app.apis", "agents_app.api.health", ["health_view"]),
    ("agents_app.apis", "agents_app.api.schema_view", ["SchemaView"]),
    ("agents_app.ops_views", "agents_app.api.health", ["readiness_view"]),
    ("agents_app.api_schema", "agents_app.api.schema", ["ApiAutoSchema"]),
    (
        "agents_app.api_pagination",
        "agents_app.api.pagination",
        ["StrictLimitOffsetPagination"],
    ),
    (
        "agents_app.content_security",
        "agents_app.pages.content_security",
        ["ContentSecurityPolicyMiddleware"],
    ),
    ("agents_app.page_urls", "agents_app.pages.urls", ["app_name", "urlpatterns"]),
    ("agents_app.lifespan", "agents_app.live.lifespan", ["WebWarmUp"]),
    ("agents_app.routing", "agents_app.live.routing", ["websocket_urlpatterns"]),
    ("agents_app.kombu_filesystem", "agents_app.dev.kombu_filesystem", ["Transport"]),
    ("agents_app.demo_model", "agents_app.demo.model_server", ["main"]),
]


@pytest.mark.parametrize(("kept", "home", "names"), KEPT, ids=[f"{k}:{h}" for k, h, _ in KEPT])
def test_a_kept_path_gives_the_objects_of_their_new_home(
    kept: str, home: str, names: list[str]
) -> None:
    old, new = importlib.import_module(kept), importlib.import_module(home)
    for name in names:
        assert getattr(old, name) is getattr(new, name), f"{kept}.{name}"


def test_python_m_agents_app_demo_model_still_runs_the_demo_model() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agents_app.demo_model", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--port" in done.stdout
