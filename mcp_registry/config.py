"""The YAML declaration of trusted MCP servers (``DEXAGENTS_MCP_CONFIG``, ``manage.py mcp_import``).

The file declares servers the way an administrator would enter them in Django admin (issue 5,
"Registry"); secrets are environment-variable NAMES, never values::

    servers:
      - name: slack                      # unique; lower-case words joined by "-" or "_"
        transport: stdio                 # stdio | streamable_http
        command: /usr/bin/python3        # stdio: run without a shell
        args: ["-m", "mcp_registry.demo_servers.slack"]
        cwd: /srv/dexagents              # optional
        env: [SLACK_TOKEN]               # stdio: secret references, NAMES of worker variables
                                         #   passed to the child (discovery fails while unset)
        env_values: {LOG_LEVEL: info}    # stdio: plain, non-secret values, given as they are
        trust_annotations: true          # default false
        startup_timeout: 30              # seconds (default 30)
        call_timeout: 60                 # seconds per call (default 60)
        retries: 2                       # extra attempts for read / idempotent_write (default 2)
        isolation: session               # session | user | shared (default session)
        idle_timeout: 300                # seconds before an unused connection closes (300)
        enabled: true                    # default true
        tools:                           # optional per-tool overrides, by the server's tool name
          post_message: {requires_approval: true, effect: non_idempotent_write,
                         timeout: 10, retries: 0, enabled: true}
                                         # timeout: seconds per call, retries: extra attempts;
                                         #   absent: the server's (docs/mcp-registry.md)
      - name: remote
        transport: streamable_http
        url: https://mcp.example.com/mcp
        headers: {Authorization: REMOTE_MCP_TOKEN}   # header -> variable NAME

A server entry is its whole declaration: a key left out takes the admin form's default, so
importing the same file twice changes nothing. Parsing checks shapes only;
``services.servers_import`` runs the models' own validation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from mcp_registry.effects import ToolEffect
from mcp_registry.models import ENV_NAME_RE

CONFIG_ENV_VAR = "DEXAGENTS_MCP_CONFIG"

SERVER_KEYS = {
    "name",
    "transport",
    "command",
    "args",
    "cwd",
    "env",
    "env_values",
    "url",
    "headers",
    "trust_annotations",
    "startup_timeout",
    "call_timeout",
    "retries",
    "isolation",
    "idle_timeout",
    "enabled",
    "tools",
}
TOOL_KEYS = {"enabled", "effect", "requires_approval", "timeout", "retries"}


class McpConfigError(ValueError):
    """The configuration cannot be imported; ``str(error)`` names the entry and the problem."""


@dataclass(frozen=True)
class ToolOverrides:
    """The administrator overrides of one tool; ``None`` means "no override"."""

    enabled: bool = True
    effect: str | None = None
    requires_approval: bool | None = None
    timeout: int | None = None
    retries: int | None = None


@dataclass(frozen=True)
class ServerDeclaration:
    """One server entry: ``fields`` maps ``McpServer`` field names to values (every field
    the admin form has, defaults filled in); ``tools`` maps tool names to overrides."""

    name: str
    fields: dict[str, Any]
    tools: dict[str, ToolOverrides] = field(default_factory=dict)


def _expect(value: Any, kind: type, where: str, what: str) -> Any:
    # bool is an int in Python; a YAML "true" must not pass as a number of seconds.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise McpConfigError(f"{where}: {what}")
    return value


def _non_negative_int(value: Any, where: str, key: str) -> int:
    _expect(value, int, where, f"{key} must be a whole number")
    if value < 0:
        raise McpConfigError(f"{where}: {key} must not be negative")
    return int(value)


def _positive_int(value: Any, where: str, key: str) -> int:
    number = _non_negative_int(value, where, key)
    if number < 1:
        raise McpConfigError(f"{where}: {key} must be at least 1")
    return number


def _isolation(value: Any, where: str) -> str:
    if value not in ("session", "user", "shared"):
        raise McpConfigError(f"{where}: isolation must be session, user or shared, not {value!r}")
    return str(value)


def _tool_overrides(raw: Any, where: str) -> ToolOverrides:
    if raw is None:
        return ToolOverrides()
    _expect(raw, dict, where, "a tool entry must be a mapping")
    unknown = sorted(set(raw) - TOOL_KEYS)
    if unknown:
        raise McpConfigError(f"{where}: unknown keys {', '.join(unknown)}")
    effect = raw.get("effect")
    if effect is not None and effect not in ToolEffect.values:
        raise McpConfigError(
            f"{where}: effect must be one of {', '.join(ToolEffect.values)}, not {effect!r}"
        )
    approval = raw.get("requires_approval")
    if approval is not None:
        _expect(approval, bool, where, "requires_approval must be true or false")
    enabled = raw.get("enabled", True)
    _expect(enabled, bool, where, "enabled must be true or false")
    timeout = raw.get("timeout")
    retries = raw.get("retries")
    return ToolOverrides(
        enabled=enabled,
        effect=effect,
        requires_approval=approval,
        timeout=None if timeout is None else _positive_int(timeout, where, "timeout"),
        retries=None if retries is None else _non_negative_int(retries, where, "retries"),
    )


def _server(raw: Any, index: int) -> ServerDeclaration:
    where = f"servers[{index}]"
    _expect(raw, dict, where, "a server entry must be a mapping")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise McpConfigError(f"{where}: name is required")
    where = f"server {name!r}"
    unknown = sorted(set(raw) - SERVER_KEYS)
    if unknown:
        raise McpConfigError(f"{where}: unknown keys {', '.join(unknown)}")
    transport = raw.get("transport")
    if transport not in ("stdio", "streamable_http"):
        raise McpConfigError(f"{where}: transport must be stdio or streamable_http")
    args = raw.get("args", [])
    _expect(args, list, where, "args must be a list of strings")
    if not all(isinstance(arg, str) for arg in args):
        raise McpConfigError(f"{where}: args must be a list of strings")
    env = raw.get("env", [])
    _expect(env, list, where, "env must be a list of environment variable names")
    for position, env_name in enumerate(env, start=1):
        # The message never repeats the entry: it may be a secret pasted by mistake.
        if not isinstance(env_name, str) or not ENV_NAME_RE.match(env_name):
            raise McpConfigError(
                f"{where}: env entry {position} is not an environment variable name "
                "(give the variable's NAME, never its value)"
            )
    env_values = raw.get("env_values", {})
    _expect(env_values, dict, where, "env_values must map variable names to strings")
    for env_name, value in env_values.items():
        if not isinstance(env_name, str) or not ENV_NAME_RE.match(env_name):
            raise McpConfigError(
                f"{where}: env_values key {env_name!r} is not an environment variable name"
            )
        if not isinstance(value, str):
            raise McpConfigError(
                f"{where}: env_values {env_name} must be a string (quote numbers and booleans)"
            )
    headers = raw.get("headers", {})
    _expect(headers, dict, where, "headers must map header names to variable names")
    for header, env_name in headers.items():
        if not isinstance(env_name, str) or not ENV_NAME_RE.match(env_name):
            raise McpConfigError(
                f"{where}: the value of header {header!r} is not an environment variable name "
                "(give the variable's NAME, never its value)"
            )
    fields = {
        "transport": transport,
        "command": _expect(raw.get("command", ""), str, where, "command must be a string"),
        "args": list(args),
        "cwd": _expect(raw.get("cwd", "") or "", str, where, "cwd must be a string"),
        "env_names": list(env),
        "env_values": dict(env_values),
        "url": _expect(raw.get("url", "") or "", str, where, "url must be a string"),
        "header_env": dict(headers),
        "trust_annotations": _expect(
            raw.get("trust_annotations", False), bool, where, "trust_annotations must be a bool"
        ),
        "startup_timeout": _positive_int(
            raw.get("startup_timeout", 30), where, "startup_timeout"
        ),
        "call_timeout": _positive_int(raw.get("call_timeout", 60), where, "call_timeout"),
        "retries": _non_negative_int(raw.get("retries", 2), where, "retries"),
        "isolation": _isolation(raw.get("isolation", "session"), where),
        "idle_timeout": _positive_int(raw.get("idle_timeout", 300), where, "idle_timeout"),
        "enabled": _expect(raw.get("enabled", True), bool, where, "enabled must be a bool"),
    }
    tools_raw = raw.get("tools") or {}
    _expect(tools_raw, dict, where, "tools must map tool names to overrides")
    tools = {
        str(tool): _tool_overrides(overrides, f"{where}, tool {tool!r}")
        for tool, overrides in tools_raw.items()
    }
    return ServerDeclaration(name=name, fields=fields, tools=tools)


def mcp_config_parse(text: str) -> list[ServerDeclaration]:
    """Parse the YAML ``text`` of an MCP configuration (format in this module's docstring).

    Returns:
        One declaration per server, in file order.

    Raises:
        McpConfigError: Not YAML, not the expected shape, an unknown key, a repeated server
            name, or a value of the wrong type. Nothing has been written anywhere.
    """
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise McpConfigError(f"not valid YAML: {error}") from error
    if not isinstance(document, dict) or set(document) - {"servers"}:
        raise McpConfigError("the file must be a mapping with one key, 'servers'")
    servers_raw = document.get("servers") or []
    if not isinstance(servers_raw, list):
        raise McpConfigError("'servers' must be a list")
    declarations = [_server(raw, index) for index, raw in enumerate(servers_raw)]
    seen: set[str] = set()
    for declaration in declarations:
        if declaration.name in seen:
            raise McpConfigError(f"server {declaration.name!r} is declared twice")
        seen.add(declaration.name)
    return declarations
