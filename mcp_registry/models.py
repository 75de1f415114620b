"""Trusted MCP servers and the tools discovered on them.

Credentials never live here: a server lists the NAMES of environment variables that the
Dex worker passes to a stdio child (``env_names``, its secret references) or sends as HTTP
headers (``header_env``); the values come from the worker's own environment. Plain,
non-secret settings of a stdio child are kept apart, with their values (``env_values``).

One module, as a Django app keeps its models: the four tables (servers, their tools, the
worker's stdio processes and HTTP sessions) and the validators of their JSON fields, which
migrations reference by this module's path. Decisions about a tool (effect, approval, timeout,
attempts) live in ``mcp_registry.effects``; the models only read them.
"""

import re
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

from mcp_registry.effects import (
    Decision,
    ToolEffect,
    annotations_destructive,
    approval_decide,
    attempts_decide,
    effect_decide,
    step_timeout_seconds,
    timeout_decide,
)
from mcp_registry.function_specs import EXPOSED_NAME_SEPARATOR, exposed_name_build

# Lower-case words joined by single "-" or "_", so "<server>__<tool>" stays unambiguous.
SERVER_NAME_RE = r"^[a-z0-9]+(?:[-_][a-z0-9]+)*$"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
__all__ = [
    "EXPOSED_NAME_SEPARATOR",
    "ISOLATION_CROSSES",
    "McpHttpSession",
    "McpServer",
    "McpServerProcess",
    "McpTool",
]

#: What each isolation level lets cross from one agent session to another (shown in admin and
#: docs/mcp-registry.md).
ISOLATION_CROSSES = {
    "session": (
        "Nothing. Every agent session gets its own connection: its own stdio process, or its "
        "own Streamable-HTTP session (Mcp-Session-Id). Server-side state, resources, log "
        "messages and progress stay within the session. Costs one process per active session "
        "for a stdio server, until the session is idle for the idle timeout."
    ),
    "user": (
        "Server-side state between the sessions of one user: they share one connection, so a "
        "file or resource one of them created is visible to the others, and a log message or "
        "question of the server reaches a call only while it is that user's one call in "
        "flight. Nothing crosses between users."
    ),
    "shared": (
        "Everything the server keeps: every user's calls share one connection, so state one "
        "user's call created is visible to every other user. Only for servers that keep no "
        "per-client state. Log messages go to the worker log, never to a session, and the "
        "server's questions (elicitation) are declined."
    ),
}


def validate_string_list(value: Any) -> None:
    """Raise ValidationError unless ``value`` is a JSON list of strings."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValidationError("Enter a JSON list of strings.")


def validate_env_names(value: Any) -> None:
    """Raise ValidationError unless ``value`` is a list of environment variable names."""
    validate_string_list(value)
    bad = [name for name in value if not ENV_NAME_RE.match(name)]
    if bad:
        raise ValidationError(
            "Not environment variable names: %(names)s. Store names, never values.",
            params={"names": ", ".join(bad)},
        )


def validate_env_values(value: Any) -> None:
    """Raise ValidationError unless ``value`` maps environment variable names to strings."""
    if not isinstance(value, dict):
        raise ValidationError('Enter a JSON object such as {"LOG_LEVEL": "info"}.')
    bad = [name for name in value if not ENV_NAME_RE.match(name)]
    if bad:
        raise ValidationError(
            "Not environment variable names: %(names)s.", params={"names": ", ".join(bad)}
        )
    for name, text in value.items():
        if not isinstance(text, str) or "\0" in text:
            raise ValidationError(
                "The value of %(name)s must be a string (without NUL characters).",
                params={"name": name},
            )


def validate_header_env(value: Any) -> None:
    """Raise ValidationError unless ``value`` maps HTTP header names to env variable names."""
    if not isinstance(value, dict):
        raise ValidationError('Enter a JSON object such as {"Authorization": "SEARCH_TOKEN"}.')
    for header, env_name in value.items():
        if not HEADER_NAME_RE.match(header):
            raise ValidationError(
                "%(header)s is not an HTTP header name.", params={"header": header}
            )
        if not isinstance(env_name, str) or not ENV_NAME_RE.match(env_name):
            raise ValidationError(
                "The value for %(header)s must be an environment variable name.",
                params={"header": header},
            )


def validate_json_object(value: Any) -> None:
    """Raise ValidationError unless ``value`` is a JSON object."""
    if not isinstance(value, dict):
        raise ValidationError("Enter a JSON object.")


class McpServer(models.Model):
    """One trusted MCP server the Dex worker may connect to.

    ``startup_timeout`` and ``call_timeout`` are seconds; ``retries`` is the number of
    extra attempts for ``read`` and ``idempotent_write`` calls.
    """

    class Transport(models.TextChoices):
        STDIO = "stdio", "stdio (child process)"
        STREAMABLE_HTTP = "streamable_http", "Streamable HTTP"

    class Isolation(models.TextChoices):
        SESSION = "session", "session: one connection per agent session"
        USER = "user", "user: one connection per user"
        SHARED = "shared", "shared: one connection for everyone"

    name = models.CharField(
        max_length=64,
        unique=True,
        validators=[
            RegexValidator(
                SERVER_NAME_RE,
                "Use lower-case letters and digits joined by single '-' or '_'.",
            )
        ],
        help_text="Prefix of every tool name the model sees: SERVER__TOOL.",
    )
    transport = models.CharField(max_length=32, choices=Transport.choices)
    command = models.CharField(
        max_length=1000, blank=True, help_text="stdio: the program, run without a shell."
    )
    args = models.JSONField(
        default=list, blank=True, validators=[validate_string_list], help_text="stdio: arguments."
    )
    cwd = models.CharField(max_length=1000, blank=True, help_text="stdio: working directory.")
    env_names = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_env_names],
        verbose_name="secret references",
        help_text=(
            "stdio: NAMES of worker environment variables passed to the child, for secrets; "
            'discovery fails while one is unset. Example: ["GITHUB_TOKEN"].'
        ),
    )
    env_values = models.JSONField(
        "plain environment values",
        default=dict,
        blank=True,
        validators=[validate_env_values],
        help_text=(
            "stdio: non-secret settings given to the child as they are, shown here and in "
            'logs. Example: {"MEMORY_FILE_PATH": "/srv/memory.jsonl"}. Never put secrets '
            "here: use secret references."
        ),
    )
    url = models.URLField(max_length=2000, blank=True, help_text="Streamable HTTP: endpoint URL.")
    header_env = models.JSONField(
        default=dict,
        blank=True,
        validators=[validate_header_env],
        help_text="Streamable HTTP: {header name: worker environment variable NAME}.",
    )
    trust_annotations = models.BooleanField(
        default=False,
        help_text="Map tool annotations to effects; otherwise every tool is unclassified.",
    )
    startup_timeout = models.PositiveIntegerField(
        default=30, validators=[MinValueValidator(1)], help_text="Seconds."
    )
    call_timeout = models.PositiveIntegerField(
        default=60, validators=[MinValueValidator(1)], help_text="Seconds per tool call."
    )
    retries = models.PositiveSmallIntegerField(
        default=2, help_text="Extra attempts for read and idempotent_write calls."
    )
    isolation = models.CharField(
        max_length=16,
        choices=Isolation.choices,
        default=Isolation.SESSION,
        help_text=(
            "Which calls share a connection (a stdio process or an HTTP session), and so the "
            "server's state: session (the default) keeps every agent session apart; user and "
            "shared are for servers that keep no per-client state."
        ),
    )
    idle_timeout = models.PositiveIntegerField(
        default=300,
        validators=[MinValueValidator(1)],
        help_text=(
            "Seconds a connection may stay unused before the worker closes it (a stdio "
            "process stops, an HTTP session is ended)."
        ),
    )
    enabled = models.BooleanField(default=True)
    last_discovered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name",)
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Require the fields of the chosen transport; raise ValidationError per field."""
        if self.transport == self.Transport.STDIO and not self.command:
            raise ValidationError({"command": "A stdio server needs a command."})
        if self.transport == self.Transport.STREAMABLE_HTTP and not self.url:
            raise ValidationError({"url": "A Streamable HTTP server needs a URL."})
        if isinstance(self.env_names, list) and isinstance(self.env_values, dict):
            both = sorted(set(self.env_names) & set(self.env_values))
            if both:
                raise ValidationError(
                    {
                        "env_values": (
                            f"{', '.join(both)} is also a secret reference; give each "
                            "variable in one place only."
                        )
                    }
                )

    @property
    def last_discovery(self) -> tuple[Any, bool | None]:
        """``(time, succeeded)`` of the last discovery; ``(None, None)`` before the first.

        A failure sets ``last_error_at`` and a success clears it, so a set ``last_error_at``
        is the last attempt, and failed.
        """
        if self.last_error_at is not None:
            return self.last_error_at, False
        if self.last_discovered_at is not None:
            return self.last_discovered_at, True
        return None, None


class McpTool(models.Model):
    """One tool of an MCP server, as last discovered, plus the administrator's overrides.

    ``available`` is false when the last discovery no longer listed the tool, or listed it
    with an input schema that cannot be offered to a model or as requiring MCP task
    augmentation, which the client cannot do (``quarantine_reason`` then says why;
    ``services.server_tools_replace``); the row is kept so overrides and agent links survive
    a tool that comes back.
    ``exposed_name`` is the function name models see (``mcp_registry.function_specs``);
    ``parameters`` is ``input_schema`` converted for OpenAI-style function calling.
    """

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=200)
    exposed_name = models.CharField(
        max_length=64,
        blank=True,
        db_index=True,
        editable=False,
        help_text="The function name models see: SERVER__TOOL, at most 64 characters.",
    )
    title = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict, blank=True, validators=[validate_json_object])
    parameters = models.JSONField(
        default=dict,
        blank=True,
        editable=False,
        help_text="The input schema as offered to models (OpenAI-style function parameters).",
    )
    quarantine_reason = models.TextField(
        blank=True,
        editable=False,
        help_text=(
            "Why the tool cannot be offered to models (an input schema that cannot be made "
            "valid, or a required MCP task augmentation); empty when it can."
        ),
    )
    annotations = models.JSONField(default=dict, blank=True, validators=[validate_json_object])
    output_schema = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text=(
            "The JSON Schema the tool's structured results follow, as discovered; results are "
            "checked against it."
        ),
    )
    enabled = models.BooleanField(default=True)
    available = models.BooleanField(
        default=True,
        help_text=(
            "Listed by the server at the last discovery, and not quarantined (see "
            "'quarantined because')."
        ),
    )
    # NULL means "no override", which an empty string would not say as clearly.
    effect_override = models.CharField(
        max_length=32, choices=ToolEffect.choices, null=True, blank=True
    )
    requires_approval_override = models.BooleanField(
        null=True, blank=True, help_text="Empty: every effect but read requires approval."
    )
    timeout_override = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Seconds."
    )
    retries_override = models.PositiveSmallIntegerField(null=True, blank=True)
    approval_deadline_override = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=(
            "Seconds an approval of this tool may wait before it counts as rejected. "
            "Empty: the agent's approval deadline."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("server__name", "name")
        verbose_name = "MCP tool"
        constraints = [
            models.UniqueConstraint(fields=("server", "name"), name="mcp_tool_unique_per_server"),
        ]

    def __str__(self) -> str:
        return self.exposed_name or f"{self.server.name}{EXPOSED_NAME_SEPARATOR}{self.name}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Fill ``exposed_name`` and ``parameters`` when empty, then save.

        Discovery (``services.server_tools_replace``) assigns collision-free names across all
        tools; this default covers rows created elsewhere (seeding, tests).
        """
        if not self.exposed_name:
            self.exposed_name = exposed_name_build(
                server_name=self.server.name, tool_name=self.name
            )
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "exposed_name"}
        if not self.parameters and self.input_schema and not self.quarantine_reason:
            from mcp_registry.function_specs import ToolSchemaError, function_parameters_build

            try:
                self.parameters = function_parameters_build(self.input_schema)
            except ToolSchemaError:
                pass
            else:
                if kwargs.get("update_fields") is not None:
                    kwargs["update_fields"] = {*kwargs["update_fields"], "parameters"}
        super().save(*args, **kwargs)

    @property
    def effect_decision(self) -> Decision:
        """The effective effect and the rule that decided it (``effects.effect_decide``)."""
        return effect_decide(
            annotations=self.annotations,
            trusted=self.server.trust_annotations,
            override=self.effect_override,
        )

    @property
    def effective_effect(self) -> str:
        """The override if set, else the effect mapped from annotations (mcp_registry.effects)."""
        return str(self.effect_decision.value)

    @property
    def approval_decision(self) -> Decision:
        """Whether a call waits for approval and the rule that decided it."""
        return approval_decide(
            effect=self.effective_effect,
            override=self.requires_approval_override,
            destructive=self.server.trust_annotations
            and annotations_destructive(self.annotations),
        )

    @property
    def effective_requires_approval(self) -> bool:
        """The override if set, else true for every effect but ``read``."""
        return bool(self.approval_decision.value)

    @property
    def timeout_decision(self) -> Decision:
        """Seconds one call's MCP request may take and where that comes from
        (``effects.timeout_decide``)."""
        return timeout_decide(
            call_timeout=self.server.call_timeout, override=self.timeout_override
        )

    @property
    def effective_timeout(self) -> int:
        """Seconds allowed for one call of this tool."""
        return int(self.timeout_decision.value)

    @property
    def effective_retries(self) -> int:
        """Extra attempts for a retryable call of this tool."""
        if self.retries_override is not None:
            return self.retries_override
        return self.server.retries

    @property
    def attempts_decision(self) -> Decision:
        """How many attempts one call gets and why (``effects.attempts_decide``): writes that
        may not be repeated get one, whatever the retries say."""
        return attempts_decide(
            effect=self.effective_effect,
            retries=self.server.retries,
            override=self.retries_override,
        )

    @property
    def step_timeout(self) -> int:
        """Seconds each attempt of a call's Dex Step may run: the call timeout, the server's
        startup timeout and a margin (``effects.step_timeout_seconds``)."""
        return step_timeout_seconds(
            call_timeout=self.effective_timeout, startup_timeout=self.server.startup_timeout
        )


class McpServerProcess(models.Model):
    """A stdio server process run by one Dex worker for one scope, as the worker last
    reported it (one row per process start, so a crash stays readable after a restart).

    The worker's MCP client pool reports every start, handshake, stop, exit and failure, and
    new stderr lines (``mcp_registry.tasks.process_status_record``); the admin shows the rows
    of each server. ``worker`` is ``<host>:<pid>`` of the worker process, ``scope`` the
    connection's scope key (``session <id>``, ``user <id>``, ``shared``). ``exit_code`` is the
    server's exit status when it exited on its own (negative: killed by that signal).
    ``stderr_tail`` holds the last lines, with the values of secret references replaced by
    ``[NAME]``; no environment value is stored here.
    """

    class State(models.TextChoices):
        STARTING = "starting", "starting"
        RUNNING = "running", "running"
        STOPPED = "stopped", "stopped"
        EXITED = "exited", "exited"
        FAILED = "failed", "failed to start"

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="processes")
    worker = models.CharField(max_length=300, help_text="<host>:<pid> of the Dex worker.")
    scope = models.CharField(
        max_length=300,
        default="shared",
        help_text="Whose calls the process serves: session <id>, user <id> or shared.",
    )
    state = models.CharField(max_length=16, choices=State.choices)
    guard_pid = models.PositiveIntegerField(
        null=True, blank=True, help_text="The guard process, leader of the process group."
    )
    server_pid = models.PositiveIntegerField(
        null=True, blank=True, help_text="The server command itself."
    )
    restarts = models.PositiveIntegerField(
        default=0, help_text="Times this worker reopened the server after its first start."
    )
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(
        null=True,
        blank=True,
        help_text="Exit status when it exited on its own; negative: killed by that signal.",
    )
    stderr_tail = models.TextField(blank=True)
    error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("server__name", "-updated_at")
        verbose_name = "MCP server process"
        constraints = [
            models.UniqueConstraint(
                fields=("server", "worker", "scope", "started_at"),
                name="mcp_server_process_unique_per_start",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.server.name} ({self.scope}) on {self.worker}: {self.state}"


class McpHttpSession(models.Model):
    """A Streamable-HTTP MCP session a Dex worker holds open (MCP specification,
    "Transports/Session Management").

    The worker records each session its pool opens and deletes the row when it ends it with
    ``DELETE``. A worker killed by SIGKILL leaves its rows; the next worker started on the
    same host ends those sessions (``services.http_sessions_orphaned_close``). ``session_id``
    is the ``Mcp-Session-Id`` the server assigned; it is a handle, not a credential the
    server's own authentication headers replace.
    """

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="http_sessions")
    worker = models.CharField(max_length=300, help_text="<host>:<pid> of the Dex worker.")
    scope = models.CharField(max_length=300)
    session_id = models.CharField(max_length=300)
    protocol_version = models.CharField(max_length=40, blank=True)
    opened_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("server__name", "opened_at")
        verbose_name = "MCP HTTP session"
        constraints = [
            models.UniqueConstraint(
                fields=("server", "session_id"), name="mcp_http_session_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.server.name} session {self.session_id} ({self.scope})"
