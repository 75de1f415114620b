"""Reads of the MCP registry (HackSoft "selectors")."""

import os
import shutil
from typing import TYPE_CHECKING, cast

from django.db.models import QuerySet

from mcp_registry.models import McpServer, McpTool

if TYPE_CHECKING:
    from mcp_registry.client import Isolation, McpServerSpec, Transport


def server_spec_build(*, server: McpServer) -> "McpServerSpec":
    """Build the Django-free connection spec of ``server`` for ``mcp_registry.client``.

    Returns:
        ``McpServerSpec(name, transport, command, args, cwd, env_names, env, url,
        header_env, startup_timeout, call_timeout, isolation, idle_timeout,
        tool_output_schemas)``; timeouts are seconds; ``env_names`` and header values are
        variable NAMES resolved by the client in the worker's environment, ``env`` the plain
        non-secret values; ``tool_output_schemas`` maps each tool's name to the output schema
        stored at its last discovery (``None``: none declared).
    """
    from mcp_registry.client import McpServerSpec

    return McpServerSpec(
        name=server.name,
        transport=cast("Transport", server.transport),
        command=server.command,
        args=list(server.args),
        cwd=server.cwd or None,
        env_names=list(server.env_names),
        env=dict(server.env_values),
        url=server.url,
        header_env=dict(server.header_env),
        startup_timeout=float(server.startup_timeout),
        call_timeout=float(server.call_timeout),
        isolation=cast("Isolation", server.isolation),
        idle_timeout=float(server.idle_timeout),
        tool_output_schemas=dict(server.tools.values_list("name", "output_schema")),
    )


def server_spec_get(*, name: str) -> "McpServerSpec":
    """Return the connection spec of the enabled server called ``name``.

    Raises:
        McpServer.DoesNotExist: No enabled server has that name.
    """
    return server_spec_build(server=McpServer.objects.get(name=name, enabled=True))


def tool_list_exposable(*, server_names: list[str] | None = None) -> QuerySet[McpTool]:
    """Tools a model may be offered: enabled, available (listed, not quarantined), on an
    enabled server.

    Args:
        server_names: Restrict to these servers; ``None`` means all.
    """
    tools = McpTool.objects.select_related("server").filter(
        enabled=True, available=True, server__enabled=True
    )
    if server_names is not None:
        tools = tools.filter(server__name__in=server_names)
    return tools


def tool_get_by_exposed_name(*, exposed_name: str) -> McpTool:
    """Return the tool whose model-facing name is ``exposed_name`` (``McpTool.exposed_name``).

    Raises:
        McpTool.DoesNotExist: No tool has that name.
    """
    return McpTool.objects.select_related("server").get(exposed_name=exposed_name)


def server_command_problems(*, server: McpServer) -> list[str]:
    """What would keep a stdio server from starting on this machine, as admin-readable lines.

    Checks that ``command`` is found on ``PATH`` or is an existing executable file (a relative
    path is taken from ``cwd``, as the worker runs it) and that ``cwd`` is an existing folder.
    The worker may run on another machine, so these are warnings, never validation errors.

    Returns:
        ``[]`` when nothing is wrong or the server is not stdio; otherwise one sentence per
        problem, e.g. ``"command 'npx-typo' is not on PATH and is not an existing file"``.
    """
    if server.transport != McpServer.Transport.STDIO or not server.command:
        return []
    problems: list[str] = []
    if server.cwd and not os.path.isdir(server.cwd):
        problems.append(f"working directory {server.cwd!r} is not an existing folder")
    command = server.command
    if os.sep in command or (os.altsep and os.altsep in command):
        path = command
        if not os.path.isabs(path) and server.cwd:
            path = os.path.join(server.cwd, path)
        if not os.path.isfile(path):
            problems.append(f"command {command!r} is not an existing file")
        elif not os.access(path, os.X_OK):
            problems.append(f"command {command!r} is not executable")
    elif shutil.which(command) is None:
        problems.append(f"command {command!r} is not on PATH and is not an existing file")
    return problems
