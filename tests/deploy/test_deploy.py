"""``deploy/``: the compose file against the Compose Specification schema (vendored here as
``compose-spec.json``, Apache-2.0, see ``compose-spec.LICENSE``; from compose-spec/compose-spec
commit 170098ba07d9f53c383a41bfd4c5166b0a4529a6), the services and commands it names, the
Procfile (a Celery worker for the default queue and one for MCP tool discovery), and the
settings table of ``docs/deploy.md``.

``docker compose config`` runs too where the Compose plugin is installed; elsewhere that one
test is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
SCHEMA = Path(__file__).with_name("compose-spec.json")

#: What the compose file requires from the environment, for interpolation.
REQUIRED_ENV = {
    "SECRET_KEY": "test-secret-key-for-validation-only",
    "POSTGRES_PASSWORD": "pw",
    "DEX_SERVER_ADDRESS": "dex.example.internal:8801",
}

_VARIABLE = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}")


def interpolate(node: Any, env: dict[str, str]) -> Any:
    """Compose's ``${NAME}``, ``${NAME:-default}`` and ``${NAME:?error}`` over every string.

    Raises:
        KeyError: A ``:?`` variable is unset or empty (Compose refuses the file then too).
    """
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, env) for value in node]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match[str]) -> str:
        value = env.get(match["name"], "")
        if match["op"] == ":?" and not value:
            raise KeyError(f"{match['name']}: {match['arg']}")
        if match["op"] == ":-" and not value:
            return match["arg"]
        return value

    return _VARIABLE.sub(substitute, node)


def compose_document() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return document


def management_commands() -> set[str]:
    from django.core.management import get_commands

    return set(get_commands())


def check_command(argv: list[str], commands: set[str]) -> None:
    """``argv`` starts a real program of this repository: a management command that exists,
    the Celery app's worker or beat, or a script under deploy/ that does."""
    if argv[:2] == ["python", "manage.py"]:
        assert argv[2] in commands, argv
    elif argv[0] == "celery":
        assert argv[1:3] == ["-A", "dexagents_site"], argv
        assert (ROOT / "dexagents_site" / "celery.py").is_file()
        assert argv[3] in {"worker", "beat"}, argv
    elif argv[0].startswith("deploy/"):
        script = ROOT / argv[0]
        assert script.is_file() and os.access(script, os.X_OK), argv
        text = script.read_text()
        assert "dexagents_site.asgi:application" in text
        asgi = (ROOT / "dexagents_site" / "asgi.py").read_text()
        assert re.search(r"^application\b", asgi, re.MULTILINE), "no ASGI application"
    else:
        raise AssertionError(f"unknown program in {argv}")
    if "dexworker" in argv:
        for option in argv[3:]:
            if option.startswith("--"):
                from agents_app.management.commands.dexworker import Command

                parser = Command().create_parser("manage.py", "dexworker")
                assert option in parser._option_string_actions, option


def check_celery_workers(workers: dict[str, list[str]]) -> None:
    """The ``celery`` worker consumes the default queue alone and the ``discovery`` worker the
    queue that settings route MCP tool discovery to (``CELERY_TASK_ROUTES``), each with ``-Q``,
    so a discovery that hangs on a server never holds the worker of outbox deliveries."""
    from agents_app.management.commands.dev import celery_queues

    default_queue, discovery_queue = celery_queues()
    for name, queue in (("celery", default_queue), ("discovery", discovery_queue)):
        argv = workers[name]
        assert argv[3] == "worker", argv
        assert argv.count("-Q") == 1 and argv[argv.index("-Q") + 1] == queue, argv


def test_compose_file_matches_the_compose_specification() -> None:
    schema = json.loads(SCHEMA.read_text())
    document = compose_document()
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(document)
    interpolated = interpolate(document, REQUIRED_ENV)
    jsonschema.Draft7Validator(schema).validate(interpolated)
    with pytest.raises(KeyError, match="DEX_SERVER_ADDRESS"):
        interpolate(document, {**REQUIRED_ENV, "DEX_SERVER_ADDRESS": ""})


def test_the_schema_check_can_fail() -> None:
    schema = json.loads(SCHEMA.read_text())
    document = compose_document()
    document["services"]["web"]["restart"] = ["always"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(document)


def test_compose_topology_and_commands(db: None) -> None:
    document = interpolate(compose_document(), REQUIRED_ENV)
    services: dict[str, Any] = document["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "worker", "celery",
                             "discovery", "beat"}
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, (name, dependency)
        for volume in service.get("volumes", []):
            assert volume.split(":", 1)[0] in document["volumes"], (name, volume)
    commands = management_commands()
    for name in ("migrate", "web", "worker", "celery", "discovery", "beat"):
        service = services[name]
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (DEPLOY / service["build"]["context"]).resolve() == ROOT
        check_command(service["command"], commands)
        env = service["environment"]
        assert env["DATABASE_URL"].startswith("postgres://dexagents:pw@postgres:5432/")
        assert env["REDIS_URL"] == "redis://redis:6379/0"
        assert env["DEX_SERVER_ADDRESS"] == REQUIRED_ENV["DEX_SERVER_ADDRESS"]
    assert services["beat"]["deploy"]["replicas"] == 1
    assert services["worker"]["deploy"]["replicas"] == "2"
    check_celery_workers({name: services[name]["command"] for name in ("celery", "discovery")})


def test_procfile_names_real_programs(db: None) -> None:
    commands = management_commands()
    entries = dict(
        line.split(":", 1) for line in (DEPLOY / "Procfile").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert set(entries) == {"release", "web", "worker", "celery", "discovery", "beat"}
    for argv in entries.values():
        check_command(shlex.split(argv), commands)
    check_celery_workers({name: shlex.split(entries[name]) for name in ("celery", "discovery")})


def test_dockerfile_copies_what_it_installs() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (\S+) ", text, re.MULTILINE):
        assert (ROOT / source).exists(), source
    assert 'CMD ["deploy/run-web.sh"]' in text


def settings_environment_variables() -> set[str]:
    """Every variable the settings module reads (``env.*("X")``, ``env_bool``, ``env_int``,
    ``env_list``) or lists in its docstring under "Environment variables"."""
    import dexagents_site.settings as site_settings

    source = Path(site_settings.__file__).read_text()
    read = set(re.findall(r'(?:env\.\w+|env_bool|env_int|env_list)\(\s*"([A-Z][A-Z0-9_]*)"',
                          source))
    doc = (site_settings.__doc__ or "").split("Environment variables:", 1)[1]
    listed = set(re.findall(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b", doc))
    return read | listed


def test_deploy_docs_have_every_setting() -> None:
    docs = (ROOT / "docs" / "deploy.md").read_text()
    table_names = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", docs, re.MULTILINE))
    wanted = settings_environment_variables() | {
        "DEXAGENTS_WEB_PROCESSES", "DEXAGENTS_WORKERS", "DEXAGENTS_LOG_FORMAT",
    }
    assert "DEXAGENTS_VAR_DIR" in wanted  # the docstring parse found the list
    assert wanted <= table_names, sorted(wanted - table_names)
    compose_env: set[str] = set()
    for service in compose_document()["services"].values():
        compose_env |= set(service.get("environment", {}))
    assert compose_env - {"POSTGRES_DB", "POSTGRES_USER", "POSTGRES_PASSWORD"} <= table_names


def test_docker_compose_config() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        pytest.skip("the docker compose plugin is not installed: " + probe.stderr.strip())
    done = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_FILE), "config", "--quiet"],
        env={**os.environ, **REQUIRED_ENV}, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
