"""createtoken and seed_demo management commands."""

import io
import sys
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from agents_app.auth import user_for_token_key
from agents_app.models import AgentDefinition, ApiToken
from mcp_registry.models import McpServer, McpTool
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_createtoken_creates_the_user_and_prints_a_working_token(client: Any) -> None:
    key = run("createtoken", "alice").strip()
    user = get_user_model().objects.get(username="alice")
    [token] = ApiToken.objects.filter(user=user)
    assert key.startswith("dxa_") and len(key) == 68
    assert key not in (token.digest, token.token_key)  # only a digest is stored
    assert token.name == "createtoken" and token.expiry is None
    assert not user.has_usable_password()
    response = client.get("/api/v1/agents/", HTTP_AUTHORIZATION=f"Token {key}")
    assert response.status_code == 200


def test_createtoken_makes_a_new_token_each_run_and_keeps_existing_users() -> None:
    UserFactory.create(username="bob")
    first = run("createtoken", "bob").strip()
    second = run("createtoken", "bob").strip()
    assert first != second
    user = get_user_model().objects.get(username="bob")
    assert user_for_token_key(first) == user_for_token_key(second) == user
    assert user.has_usable_password()


def test_createtoken_name_expires_and_replace() -> None:
    before = timezone.now()
    key = run("createtoken", "dave", "--name", "CI deploy", "--expires", "30d").strip()
    token = ApiToken.objects.get(user__username="dave")
    assert token.name == "CI deploy"
    assert token.expiry is not None
    assert abs((token.expiry - before).total_seconds() - 30 * 86400) < 60
    assert user_for_token_key(key) is not None
    run("createtoken", "dave", "--name", "laptop", "--expires", "2999-01-31T12:00:00Z")
    assert ApiToken.objects.get(name="laptop").expiry.year == 2999
    replaced = run("createtoken", "dave", "--name", "CI deploy", "--replace").strip()
    assert user_for_token_key(key) is None  # the old "CI deploy" token is revoked
    assert user_for_token_key(replaced) is not None
    assert sorted(ApiToken.objects.values_list("name", flat=True)) == ["CI deploy", "laptop"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--expires", "soon"], "give a lifetime"),
        (["--expires", "2000-01-01T00:00:00Z"], "not in the future"),
        (["--name", " "], "--name must be"),
        (["--name", "x" * 101], "--name must be"),
    ],
)
def test_createtoken_refuses_bad_options(args: list[str], fragment: str) -> None:
    with pytest.raises(CommandError, match=fragment):
        run("createtoken", "erin", *args)
    assert not ApiToken.objects.exists()


def test_createtoken_refuses_a_blank_username() -> None:
    with pytest.raises(CommandError):
        run("createtoken", " ")


def counts() -> tuple[int, ...]:
    return (
        McpServer.objects.count(),
        McpTool.objects.count(),
        AgentDefinition.objects.count(),
        get_user_model().objects.count(),
    )


def test_seed_demo_creates_the_demo_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEXAGENTS_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("DEXAGENTS_DEMO_PASSWORD", raising=False)
    first = run("seed_demo")
    assert "Admin login: admin / " in first
    demo_line = next(line for line in first.splitlines() if line.startswith("Demo login:"))
    demo_password = demo_line.split(" / ", 1)[1].split(" ", 1)[0]
    assert get_user_model().objects.get(username="demo").check_password(demo_password)
    after_first = counts()
    assert after_first == (3, 5, 3, 2)  # the demo, demo-small and demo-lead agents
    lead = AgentDefinition.objects.get(slug="demo-lead")
    assert [agent.slug for agent in lead.subagents.all()] == ["demo"]

    second = run("seed_demo")
    assert "nothing created" in second
    assert "Admin login" not in second
    assert "Demo login" not in second
    assert counts() == after_first

    server = McpServer.objects.get(name="search")
    assert server.transport == "stdio"
    assert server.command == sys.executable
    assert server.args == ["-m", "mcp_registry.demo_servers.search"]
    assert server.cwd == str(settings.BASE_DIR)
    assert server.trust_annotations is True

    config = AgentDefinition.objects.get(slug="demo").agent_config()
    assert config["model"] == "openai/dexagents-demo"
    assert config["api_base"] == f"http://127.0.0.1:{settings.DEXAGENTS['DEMO_MODEL_PORT']}/v1"
    assert config["api_key_env"] is None
    assert config["supports_images"] is True  # the demo model takes image content parts
    assert [(t["name"], t["effect"], t["requires_approval"]) for t in config["tools"]] == [
        ("docs__create_document", "idempotent_write", True),
        ("docs__search_documents", "read", False),
        ("search__web_search", "read", False),
        ("slack__post_message", "non_idempotent_write", True),
        ("slack__search_messages", "read", False),
    ]
    small = AgentDefinition.objects.get(slug="demo-small").agent_config()
    assert (small["model"], small["api_base"]) == (config["model"], config["api_base"])
    assert small["context_window"] == 4000
    assert [tool["name"] for tool in small["tools"]] == [
        "docs__create_document",
        "docs__search_documents",
        "search__web_search",
    ]
    for name in ("slack", "docs"):
        state_server = McpServer.objects.get(name=name)
        assert state_server.args == ["-m", f"mcp_registry.demo_servers.{name}"]
        assert state_server.env_names == []
        assert state_server.env_values == {"DEXAGENTS_VAR_DIR": str(settings.VAR_DIR)}
        assert state_server.command == sys.executable

    users = get_user_model().objects
    assert users.get(username="demo").has_usable_password()
    assert users.get(username="admin").is_superuser

    from agents_app.models import AgentTrigger

    trigger = AgentTrigger.objects.get()  # one, though seeded twice
    assert (trigger.agent.slug, trigger.name, trigger.run_as.get_username()) == (
        "demo", "github-pr", "demo"
    )
    assert trigger.signature_style == "github" and trigger.secret.startswith("trsec_")
    trigger.full_clean()  # its template parses


def test_seed_demo_uses_the_admin_password_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEXAGENTS_ADMIN_PASSWORD", "a-long-local-password")
    output = run("seed_demo")
    assert "a-long-local-password" not in output
    assert "Admin login" not in output
    assert get_user_model().objects.get(username="admin").check_password("a-long-local-password")


def test_seed_demo_uses_the_demo_password_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEXAGENTS_DEMO_PASSWORD", "another-long-password")
    output = run("seed_demo")
    assert "another-long-password" not in output
    assert "Demo login" not in output
    assert get_user_model().objects.get(username="demo").check_password("another-long-password")


def test_seed_demo_gives_a_token_only_demo_user_a_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DEXAGENTS_DEMO_PASSWORD", raising=False)
    demo = get_user_model().objects.create(username="demo")
    demo.set_unusable_password()
    demo.save()
    output = run("seed_demo")
    assert "Demo login: demo / " in output
    demo.refresh_from_db()
    assert demo.has_usable_password()


def test_seed_demo_leaves_edited_rows_alone() -> None:
    run("seed_demo")
    AgentDefinition.objects.filter(slug="demo").update(system_prompt="Edited.")
    McpServer.objects.filter(name="search").update(enabled=False)
    run("seed_demo")
    assert AgentDefinition.objects.get(slug="demo").system_prompt == "Edited."
    assert McpServer.objects.get(name="search").enabled is False


def test_seed_demo_does_not_recreate_a_tool_discovery_dropped() -> None:
    run("seed_demo")
    McpTool.objects.all().delete()
    McpServer.objects.update(last_discovered_at="2026-01-01T00:00:00Z")
    run("seed_demo")
    assert McpTool.objects.count() == 0


def test_seed_demo_follows_the_demo_model_port_and_interpreter(settings: Any) -> None:
    run("seed_demo")
    McpServer.objects.filter(name="search").update(command="/old/venv/bin/python")
    settings.DEXAGENTS = {**settings.DEXAGENTS,
                          "DEMO_MODEL_API_BASE": "http://127.0.0.1:9911/v1"}
    run("seed_demo")
    assert AgentDefinition.objects.get(slug="demo").api_base == "http://127.0.0.1:9911/v1"
    assert McpServer.objects.get(name="search").command == sys.executable


def test_seed_demo_keeps_an_api_base_an_admin_pointed_elsewhere(settings: Any) -> None:
    run("seed_demo")
    AgentDefinition.objects.filter(slug="demo").update(api_base="https://models.example/v1")
    run("seed_demo")
    assert AgentDefinition.objects.get(slug="demo").api_base == "https://models.example/v1"


def test_seed_demo_adds_new_demo_servers_to_an_existing_demo_agent() -> None:
    run("seed_demo")
    agent = AgentDefinition.objects.get(slug="demo")
    McpServer.objects.filter(name__in=["slack", "docs"]).delete()
    agent.tools.remove(*agent.tools.filter(server__name="search"))
    run("seed_demo")
    # The recreated servers' tools are linked again; the link an admin removed stays removed.
    assert sorted(tool.exposed_name for tool in agent.tools.all()) == [
        "docs__create_document",
        "docs__search_documents",
        "slack__post_message",
        "slack__search_messages",
    ]


def test_createtoken_staff_creates_a_staff_user() -> None:
    key = run("createtoken", "reviewer", "--staff").strip()
    user = get_user_model().objects.get(username="reviewer")
    assert user.is_staff and not user.is_superuser
    assert user_for_token_key(key) == user


def test_createtoken_staff_marks_an_existing_user_and_plain_runs_keep_it() -> None:
    UserFactory.create(username="carol")
    first = run("createtoken", "carol").strip()
    assert not get_user_model().objects.get(username="carol").is_staff
    run("createtoken", "carol", "--staff")
    run("createtoken", "carol")
    assert get_user_model().objects.get(username="carol").is_staff
    assert user_for_token_key(first) is not None  # earlier tokens keep working


@pytest.mark.parametrize(
    ("username", "fragment"),
    [("a b", "valid username"), ("x" * 151, "at most 150"), ("x" * 201, "at most 150")],
)
def test_createtoken_refuses_names_the_user_model_refuses(username: str, fragment: str) -> None:
    with pytest.raises(CommandError, match=fragment):
        run("createtoken", username)
    with pytest.raises(CommandError, match=fragment):
        run("createtoken", username, "--staff")
    assert not get_user_model().objects.filter(username=username).exists()


def test_seeded_demo_servers_start_without_the_var_dir_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`make run` does not export DEXAGENTS_VAR_DIR to the worker: slack and docs get it as a
    plain value, so their discovery starts the real servers (a fresh clone failed here with
    "environment variable DEXAGENTS_VAR_DIR ... is not set")."""
    from mcp_registry.services import server_discover_tools

    monkeypatch.delenv("DEXAGENTS_VAR_DIR", raising=False)
    run("seed_demo")
    for name in ("slack", "docs"):
        server = McpServer.objects.get(name=name)
        assert server.env_values == {"DEXAGENTS_VAR_DIR": str(settings.VAR_DIR)}
        assert "DEXAGENTS_VAR_DIR" not in server.env_names
        discovered = server_discover_tools(server=server)
        assert len(discovered) == 2, name


def test_seed_demo_moves_the_old_var_dir_reference_to_a_plain_value() -> None:
    """Demo servers seeded by earlier versions listed DEXAGENTS_VAR_DIR as a secret reference."""
    run("seed_demo")
    McpServer.objects.filter(name__in=["slack", "docs"]).update(
        env_names=["DEXAGENTS_VAR_DIR"], env_values={}
    )
    run("seed_demo")
    for server in McpServer.objects.filter(name__in=["slack", "docs"]):
        assert server.env_names == []
        assert server.env_values == {"DEXAGENTS_VAR_DIR": str(settings.VAR_DIR)}


def test_createtoken_refuses_an_expiry_past_the_calendar() -> None:
    """A fresh-clone trial got an OverflowError traceback from --expires 99999999d."""
    for value in ("99999999d", "P99999999D"):
        with pytest.raises(CommandError, match="past the year 9999"):
            run("createtoken", "alice", "--expires", value)
    assert not ApiToken.objects.exists()
