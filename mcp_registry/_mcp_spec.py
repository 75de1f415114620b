"""What the MCP client is told about a server and a request, and the errors it raises.

Part of the Django-free MCP client (``mcp_registry.client`` is its public face and re-exports
every name here): :class:`McpServerSpec` (how to reach one server; environment-variable names,
never secret values), :class:`DiscoveredTool`, :class:`McpScope` (whom a request is made for,
which decides its connection), the error classes, and the reading of a spec's secret references
from the worker's environment at connect time. Imports nothing of this package.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

Transport = Literal["stdio", "streamable_http"]
Isolation = Literal["session", "user", "shared"]
ISOLATION_LEVELS: tuple[Isolation, ...] = ("session", "user", "shared")

IDEMPOTENCY_KEY_META = "dexagents/idempotency_key"
"""The request ``_meta`` key that carries a tool call's idempotency key to the server."""


#: McpServerSpec fields that are not part of a connection's identity (``fingerprint``).
_NOT_IDENTITY = frozenset({"tool_output_schemas", "idle_timeout"})


@dataclass(frozen=True)
class McpServerSpec:
    """How to reach one MCP server; holds environment-variable names, never secret values.

    Attributes:
        name: The server's registry name (``search``); tools are exposed as ``<name>__<tool>``.
        transport: ``"stdio"`` or ``"streamable_http"``.
        command: stdio: the executable to run.
        args: stdio: its arguments.
        cwd: stdio: its working directory (``None``: the worker's).
        env_names: stdio: secret references: names of variables copied from ``os.environ``
            into the server's environment at connect time (on top of a minimal safe set:
            ``HOME``, ``PATH``, ...). A name that is not set fails the connection
            (:class:`McpTransportError` naming the variable).
        env: stdio: plain, non-secret values set in the server's environment
            (``{"MEMORY_FILE_PATH": "/srv/memory.jsonl"}``); they may be shown and logged.
        url: streamable_http: the endpoint URL.
        header_env: streamable_http: HTTP header name -> name of the variable holding its value.
        startup_timeout: Seconds allowed to spawn or connect and finish the MCP handshake.
        call_timeout: Default seconds allowed for one request (``tools/call``, one
            ``tools/list`` page).
        isolation: Which requests share a connection (see ``mcp_registry.client``): ``session``
            (one per agent session, the default), ``user`` (one per owner) or ``shared``.
        idle_timeout: Seconds a connection may stay unused before the pool closes it.
        tool_output_schemas: Tool name -> the output schema stored at discovery (``None``: the
            tool declared none). A result's structured content is checked against it. Not part
            of the connection's identity (:meth:`fingerprint`).
    """

    name: str
    transport: Transport
    command: str = ""
    args: Sequence[str] = ()
    cwd: str | None = None
    env_names: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    header_env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout: float = 30.0
    call_timeout: float = 60.0
    isolation: Isolation = "session"
    idle_timeout: float = 300.0
    tool_output_schemas: Mapping[str, dict[str, Any] | None] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def fingerprint(self) -> str:
        """A stable string identifying this configuration (names only, no secret values).

        A connection opened for one fingerprint is replaced when its server's configuration
        changes; the stored output schemas and the idle timeout do not count.
        """
        # Asked twice per tool call (``McpClientPool``): computed once per spec, and without
        # copying the stored output schemas (``asdict`` deep-copies every field).
        cached: str | None = self.__dict__.get("_fingerprint")
        if cached is None:
            identity = {
                item.name: getattr(self, item.name)
                for item in fields(self)
                if item.name not in _NOT_IDENTITY
            }
            identity["args"] = list(self.args)
            identity["env_names"] = list(self.env_names)
            identity["env"] = dict(self.env)
            identity["header_env"] = dict(self.header_env)
            cached = json.dumps(identity, sort_keys=True)
            # A frozen dataclass: the cache is no field, so equality and hashing ignore it.
            object.__setattr__(self, "_fingerprint", cached)
        return cached


@dataclass(frozen=True)
class DiscoveredTool:
    """One tool a server lists (``tools/list``).

    Attributes:
        name: The tool's name on its server.
        title: Display title: ``title``, else ``annotations.title``, else ``None``.
        description: The description, ``""`` when absent.
        input_schema: The JSON Schema of the arguments (an object schema).
        annotations: The tool annotations with wire names (``readOnlyHint``,
            ``destructiveHint``, ``idempotentHint``, ``openWorldHint``, ``title``); unset hints
            are omitted.
        output_schema: The JSON Schema its structured content follows, or ``None``.
        task_support: ``execution.taskSupport`` (``"forbidden"``, ``"optional"`` or
            ``"required"``), ``None`` when the tool does not say.
        invalid_reason: Why the server's entry for this tool is not a valid MCP tool (its
            other tools are still read; discovery quarantines this one with the reason), or
            ``None``.
    """

    name: str
    title: str | None
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    task_support: str | None = None
    invalid_reason: str | None = None


@dataclass(frozen=True)
class McpScope:
    """Whom a request is made for, which decides the connection it travels on.

    Attributes:
        session_id: The agent session (Dex Flow ID) the request belongs to.
        user_id: The session owner's ID, as text; ``None`` when unknown, in which case a
            ``user``-isolated server treats the session as its own user.
    """

    session_id: str
    user_id: str | None = None

    def key(self, isolation: Isolation) -> str:
        """The connection key under ``isolation``: ``session <id>``, ``user <id>`` or
        ``shared``."""
        if isolation == "shared":
            return "shared"
        if isolation == "user" and self.user_id:
            return f"user {self.user_id}"
        return f"session {self.session_id}"


def scope_key(spec: McpServerSpec, scope: McpScope | None) -> str:
    """The key of the connection a request for ``scope`` to ``spec``'s server travels on.

    A request that names no scope (discovery-like work, tests) uses the ``shared`` one.
    """
    return "shared" if scope is None else scope.key(spec.isolation)


class McpClientError(Exception):
    """Base class of this module's errors. ``message`` is safe to log (it holds no secrets)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class McpToolError(McpClientError):
    """The server answered the call with a failure; ``message`` is meant for the model.

    Raised for an ``isError`` result (``message`` is the result's text) and for a JSON-RPC error
    response or an invalid result (``message`` names the server, tool and the server's reason).
    Retrying the same call is not expected to help.
    """

    def __init__(self, message: str, *, structured_content: Any = None) -> None:
        super().__init__(message)
        self.structured_content = structured_content


class McpTransportError(McpClientError):
    """No answer was obtained: spawn or connect failure, handshake or call timeout, or a
    dropped connection. The call may or may not have reached the server."""


class McpPoolFullError(McpToolError):
    """The request was not sent: the pool already runs ``max_processes`` stdio servers and none
    became idle within the server's startup timeout. Nothing reached the server, so the
    caller may record it as a plain failure the model can read (it never runs twice)."""


def server_environment(spec: McpServerSpec) -> dict[str, str]:
    environment = dict(spec.env)
    missing = [name for name in spec.env_names if name not in os.environ]
    if missing:
        raise McpTransportError(
            f"MCP server {spec.name!r}: environment variable{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} (listed in its secret references) "
            f"{'are' if len(missing) > 1 else 'is'} not set in the worker's environment"
        )
    environment.update({name: os.environ[name] for name in spec.env_names})
    return environment


def secret_values(spec: McpServerSpec) -> dict[str, str]:
    """Values of the spec's secret references that are set, by name (for redaction)."""
    names = [*spec.env_names, *spec.header_env.values()]
    return {name: os.environ[name] for name in names if os.environ.get(name)}


def http_headers(spec: McpServerSpec) -> dict[str, str]:
    headers: dict[str, str] = {}
    for header, env_name in spec.header_env.items():
        value = os.environ.get(env_name)
        if value is None:
            raise McpTransportError(
                f"MCP server {spec.name!r}: environment variable {env_name} "
                f"(for header {header}) is not set"
            )
        headers[header] = value
    return headers
