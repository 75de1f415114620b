"""The demo data: MCP servers, their tools, the demo agents and the demo and admin users.

Owns ``demo_seed`` (``manage.py seed_demo``, which ``manage.py dev`` runs on every start) and
what it creates: the shipped demo MCP servers (``DEMO_SERVERS``, the modules of
``mcp_registry.demo_servers``), the ``demo`` and ``demo-small`` agents on the local demo model
(``model_server``), the ``demo`` agent's inbound trigger, the ``demo`` user and the
``admin`` superuser.

May import: the foundation (settings, models) and ``mcp_registry`` (tests/test_layering.py).
"""

import dataclasses
import os
from pathlib import Path
from typing import Any

from django.db import transaction

import mcp_registry
from agents_app.conf import dexagents_setting
from agents_app.models import (
    AgentDefinition,
    AgentSubagent,
    AgentTrigger,
    TriggerSignatureStyle,
)
from agents_app.services.triggers import trigger_secret_new

DEMO_AGENT_SLUG = "demo"
DEMO_MODEL = "openai/dexagents-demo"
#: The demo agent with a small context window, to show context compaction (``/big <n>``).
DEMO_SMALL_AGENT_SLUG = "demo-small"
DEMO_SMALL_CONTEXT_WINDOW = 4000
#: The demo agent that hands work to the demo agent as a subagent (``agent__demo``; issue 29).
DEMO_LEAD_AGENT_SLUG = "demo-lead"
DEMO_USERNAME = "demo"
#: The demo agent's inbound trigger (issue 29): GitHub-style, run as the demo user.
DEMO_TRIGGER_NAME = "github-pr"
DEMO_TRIGGER_TEMPLATE = (
    "New pull request #{{ body.pull_request.number }} \"{{ body.pull_request.title }}\" by "
    "{{ body.sender.login }}: {{ body.pull_request.html_url }}\n"
    "Summarize what a reviewer should look at first."
)
ADMIN_USERNAME = "admin"
ADMIN_PASSWORD_ENV = "DEXAGENTS_ADMIN_PASSWORD"
DEMO_PASSWORD_ENV = "DEXAGENTS_DEMO_PASSWORD"

# What the demo search server lists (mcp_registry/demo_servers/search.py), used until the
# first discovery replaces it.
DEMO_TOOL_INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "title": "Query"},
        "limit": {"type": "integer", "title": "Limit", "default": 3},
    },
    "required": ["query"],
}
DEMO_TOOL_ANNOTATIONS = {
    "title": "Web search",
    "readOnlyHint": True,
    "idempotentHint": True,
    "openWorldHint": False,
}


@dataclasses.dataclass(frozen=True)
class DemoTool:
    """A tool row a demo server lists, seeded until its first discovery replaces it."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]


#: The variable that tells the slack and docs demo servers where their state lives.
DEMO_VAR_DIR_ENV = "DEXAGENTS_VAR_DIR"


@dataclasses.dataclass(frozen=True)
class DemoServer:
    """A shipped demo MCP server: ``python -m <module>`` in the project root."""

    name: str
    module: str
    tools: tuple[DemoTool, ...]
    # The state of slack and docs lives in var/: they get DEXAGENTS_VAR_DIR as a plain value
    # (``McpServer.env_values``), set to this installation's var directory on every seed.
    uses_var_dir: bool = False
    # search keeps no per-client state (its results are a pure function of the query), so one
    # process serves every session; slack and docs keep the default, one per session.
    isolation: str = "session"

    @property
    def args(self) -> list[str]:
        return ["-m", self.module]


def _object_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def _hints(title: str, *, read_only: bool, idempotent: bool) -> dict[str, Any]:
    hints: dict[str, Any] = {
        "title": title,
        "readOnlyHint": read_only,
        "idempotentHint": idempotent,
        "openWorldHint": False,
    }
    if not read_only:
        hints["destructiveHint"] = False
    return hints


_TEXT = {"type": "string"}
_LIMIT = {"type": "integer", "default": 5}

# The tools mcp_registry/demo_servers/{search,slack,docs}.py list, in this order.
DEMO_SERVERS = (
    DemoServer(
        name="search",
        module="mcp_registry.demo_servers.search",
        isolation="shared",
        tools=(
            DemoTool(
                name="web_search",
                title="Web search",
                description=(
                    "Search the web (demo data) and return up to three results that quote the "
                    "query."
                ),
                input_schema=DEMO_TOOL_INPUT_SCHEMA,
                annotations=DEMO_TOOL_ANNOTATIONS,
            ),
        ),
    ),
    DemoServer(
        name="slack",
        module="mcp_registry.demo_servers.slack",
        uses_var_dir=True,
        tools=(
            DemoTool(
                name="search_messages",
                title="Search messages",
                description=(
                    "Search the demo chat workspace for messages containing every word of "
                    "the query."
                ),
                input_schema=_object_schema(
                    {"query": _TEXT, "channel": _TEXT, "limit": _LIMIT}, ["query"]
                ),
                annotations=_hints("Search messages", read_only=True, idempotent=True),
            ),
            DemoTool(
                name="post_message",
                title="Post a message",
                description=(
                    "Post a message to a channel of the demo chat workspace (general, "
                    "engineering, random). Each call posts a new message."
                ),
                input_schema=_object_schema({"channel": _TEXT, "text": _TEXT}, ["channel", "text"]),
                annotations=_hints("Post a message", read_only=False, idempotent=False),
            ),
        ),
    ),
    DemoServer(
        name="docs",
        module="mcp_registry.demo_servers.docs",
        uses_var_dir=True,
        tools=(
            DemoTool(
                name="search_documents",
                title="Search documents",
                description=(
                    "Search the demo document store for documents whose title or body "
                    "contains every word of the query."
                ),
                input_schema=_object_schema({"query": _TEXT, "limit": _LIMIT}, ["query"]),
                annotations=_hints("Search documents", read_only=True, idempotent=True),
            ),
            DemoTool(
                name="create_document",
                title="Create a document",
                description=(
                    "Create a document with a title and a body. Creating a title that already "
                    "exists changes nothing and returns the existing document."
                ),
                input_schema=_object_schema({"title": _TEXT, "body": _TEXT}, ["title", "body"]),
                annotations=_hints("Create a document", read_only=False, idempotent=True),
            ),
        ),
    ),
)
DEMO_SERVER_NAME = DEMO_SERVERS[0].name
#: The demo servers whose tools the ``demo-small`` agent gets: web search, and the documents
#: (whose resources can be long, to show tool results cut for the model).
SMALL_SERVERS = frozenset({"search", "docs"})
DEMO_TOOL_NAME = DEMO_SERVERS[0].tools[0].name
DEMO_SERVER_ARGS = DEMO_SERVERS[0].args


@dataclasses.dataclass(frozen=True)
class DemoSeedResult:
    """What ``demo_seed`` created; each password is set only when it was generated."""

    created: list[str]
    admin_password: str | None
    demo_password: str | None = None


DEMO_LOOPBACK_PREFIX = "http://127.0.0.1:"

#: The demo user's paused schedule (issue 29, "Schedules").
DEMO_SCHEDULE_NAME = "Weekday morning digest"


def _follow_demo_model(agent: AgentDefinition) -> None:
    """Point a demo agent still on a loopback demo model at this checkout's demo model."""
    demo_api_base = dexagents_setting("DEMO_MODEL_API_BASE")
    if agent.api_base.startswith(DEMO_LOOPBACK_PREFIX) and agent.api_base != demo_api_base:
        agent.api_base = demo_api_base
        agent.save(update_fields=["api_base"])


@transaction.atomic
def demo_seed() -> DemoSeedResult:
    """Create the demo data when missing, and point it at this checkout.

    Rows that exist are left as they are, except for the fields that are bound to the
    machine: a demo server's interpreter (while it still runs its demo module) and the
    ``demo`` agent's ``api_base`` (while it still points at a loopback demo model), so a new
    virtualenv or another ``DEMO_MODEL_PORT`` keeps the demo working.

    Creates the stdio MCP servers of ``DEMO_SERVERS`` (this interpreter running
    ``-m mcp_registry.demo_servers.<name>`` in the project root, annotations trusted; ``slack``
    and ``docs`` get ``DEXAGENTS_VAR_DIR`` so their state files land in ``var/demo_mcp``), their
    tool rows while no discovery has run, the ``demo`` agent on the local demo model
    (``DEXAGENTS["DEMO_MODEL_API_BASE"]``, ``supports_images`` on: the demo model takes image
    content parts) with ``search__web_search``,
    ``slack__search_messages``, ``slack__post_message``, ``docs__search_documents`` and
    ``docs__create_document``, the ``demo-small`` agent (the same model with a 4,000-token
    context window and the search and docs tools, to show context compaction), the user ``demo``
    whose password (for the browser pages) is
    ``$DEXAGENTS_DEMO_PASSWORD`` or generated, and the superuser ``admin`` whose password is
    ``$DEXAGENTS_ADMIN_PASSWORD`` or generated. A ``demo`` user without a usable password (made
    by an older version, which gave it a token only) gets one the same way. The ``demo`` agent
    gets the GitHub-style trigger ``github-pr`` run as ``demo`` (``DEMO_TRIGGER_TEMPLATE``;
    its secret is generated and never shown: rotate it in admin). The tools of a demo
    server created by this call are also linked to an existing ``demo`` agent.

    Returns:
        The names of created objects and, when one was generated, the admin password.
    """
    import secrets
    import sys

    from django.contrib.auth import get_user_model

    from mcp_registry.models import McpServer, McpTool

    created: list[str] = []
    agent_tools: list[McpTool] = []
    new_server_tools: list[McpTool] = []
    var_dir = str(dexagents_setting("VAR_DIR"))
    # The demo servers run as ``python -m mcp_registry.demo_servers.<name>``: from the folder
    # that holds the package, whether it is this repository or an installed site-packages.
    package_root = str(Path(mcp_registry.__file__).resolve().parent.parent)
    for demo in DEMO_SERVERS:
        env_values = {DEMO_VAR_DIR_ENV: var_dir} if demo.uses_var_dir else {}
        server, server_created = McpServer.objects.get_or_create(
            name=demo.name,
            defaults={
                "transport": McpServer.Transport.STDIO,
                "command": sys.executable,
                "args": demo.args,
                "cwd": package_root,
                "env_values": env_values,
                "trust_annotations": True,
                "isolation": demo.isolation,
            },
        )
        if server_created:
            created.append(f"MCP server {server.name}")
        elif server.args == demo.args:
            # Still the shipped demo: follow this installation's interpreter and var dir
            # (demo servers seeded before plain values listed DEXAGENTS_VAR_DIR as a secret
            # reference, which fails discovery where the worker's environment lacks it).
            changed = []
            if server.command != sys.executable:
                server.command = sys.executable
                changed.append("command")
            if demo.uses_var_dir and (
                server.env_values.get(DEMO_VAR_DIR_ENV) != var_dir
                or DEMO_VAR_DIR_ENV in server.env_names
            ):
                server.env_values = {**server.env_values, DEMO_VAR_DIR_ENV: var_dir}
                server.env_names = [n for n in server.env_names if n != DEMO_VAR_DIR_ENV]
                changed += ["env_values", "env_names"]
            if changed:
                server.save(update_fields=changed)
        for demo_tool in demo.tools:
            tool = McpTool.objects.filter(server=server, name=demo_tool.name).first()
            if tool is None and server.last_discovered_at is None:
                tool = McpTool.objects.create(
                    server=server,
                    name=demo_tool.name,
                    title=demo_tool.title,
                    description=demo_tool.description,
                    input_schema=demo_tool.input_schema,
                    annotations=demo_tool.annotations,
                )
                created.append(f"MCP tool {tool.exposed_name}")
            if tool is not None:
                agent_tools.append(tool)
                if server_created:
                    new_server_tools.append(tool)

    agent, agent_created = AgentDefinition.objects.get_or_create(
        slug=DEMO_AGENT_SLUG,
        defaults={
            "name": "Demo agent",
            "description": "Answers with the local demo model and can search the (demo) web.",
            "model": DEMO_MODEL,
            "api_base": dexagents_setting("DEMO_MODEL_API_BASE"),
            "api_key_env": "",
            "system_prompt": "You are a helpful assistant. Use web_search when it helps.",
            # The demo model takes image content parts (LiteLLM does not know it).
            "supports_images": True,
            # Its title would only repeat the first line: titles are for real models.
            "generate_titles": False,
        },
    )
    if agent_created:
        created.append(f"agent {agent.slug}")
        agent.tools.add(*agent_tools)
    else:
        if new_server_tools:
            agent.tools.add(*new_server_tools)
        _follow_demo_model(agent)
    small, small_created = AgentDefinition.objects.get_or_create(
        slug=DEMO_SMALL_AGENT_SLUG,
        defaults={
            "name": "Demo agent, small context",
            "description": (
                "The demo model with a 4,000-token context window: older messages are "
                "summarized as the conversation grows (try /big 4)."
            ),
            "model": DEMO_MODEL,
            "api_base": dexagents_setting("DEMO_MODEL_API_BASE"),
            "api_key_env": "",
            "system_prompt": "You are a helpful assistant with a small context window.",
            "context_window": DEMO_SMALL_CONTEXT_WINDOW,
            "supports_images": True,
            "generate_titles": False,
        },
    )
    if small_created:
        created.append(f"agent {small.slug}")
        small.tools.add(*[tool for tool in agent_tools if tool.server.name in SMALL_SERVERS])
    else:
        _follow_demo_model(small)
    # Subagents (issue 29): an agent whose only tool is the demo agent, as agent__demo.
    lead, lead_created = AgentDefinition.objects.get_or_create(
        slug=DEMO_LEAD_AGENT_SLUG,
        defaults={
            "name": "Demo lead (with a subagent)",
            "description": (
                "The demo model with the demo agent as a subagent: try "
                '/tool agent__demo {"task": "look up Dex"}.'
            ),
            "model": DEMO_MODEL,
            "api_base": dexagents_setting("DEMO_MODEL_API_BASE"),
            "api_key_env": "",
            "system_prompt": "You delegate research to the demo agent (agent__demo).",
            "supports_images": True,
            "generate_titles": False,
        },
    )
    if lead_created:
        created.append(f"agent {lead.slug}")
        AgentSubagent.objects.get_or_create(
            parent=lead,
            child=agent,
            defaults={"description": "The demo agent: searches the (demo) web and posts."},
        )
    else:
        _follow_demo_model(lead)

    user_model = get_user_model()
    manager = user_model._default_manager
    demo_password: str | None = None
    demo_lookup: dict[str, Any] = {user_model.USERNAME_FIELD: DEMO_USERNAME}
    demo_user, demo_created = manager.get_or_create(**demo_lookup)
    if demo_created:
        created.append(f"user {DEMO_USERNAME}")
    # A fresh row's blank password counts as "usable" to Django, so creation is checked too.
    if demo_created or not demo_user.has_usable_password():
        password = os.environ.get(DEMO_PASSWORD_ENV, "")
        if not password:
            password = demo_password = secrets.token_urlsafe(12)
        demo_user.set_password(password)
        demo_user.save(update_fields=["password"])

    _, trigger_created = AgentTrigger.objects.get_or_create(
        agent=agent,
        name=DEMO_TRIGGER_NAME,
        defaults={
            "description": "GitHub pull_request webhooks (rotate the secret in admin to use it).",
            "message_template": DEMO_TRIGGER_TEMPLATE,
            "run_as": demo_user,
            "signature_style": TriggerSignatureStyle.GITHUB,
            "idempotency_header": "X-GitHub-Delivery",
            # Never shown: an admin rotates it (the new one is shown once) to send events.
            "secret": trigger_secret_new(),
        },
    )
    if trigger_created:
        created.append(f"trigger {agent.slug}/{DEMO_TRIGGER_NAME}")
    # A paused schedule for the demo user's demo agent (issue 29), so the Schedules page shows
    # one; paused, so it starts no sessions until someone resumes it. Created directly (no
    # Dex Flow: a paused schedule has none).
    from agents_app.models import Schedule

    _, schedule_created = Schedule.objects.get_or_create(
        owner=demo_user, name=DEMO_SCHEDULE_NAME,
        defaults={
            "agent": agent, "message": "Good morning! Summarise what is new ({scheduled_for}).",
            "cron": "0 9 * * 1-5", "timezone": "UTC", "enabled": False,
        },
    )
    if schedule_created:
        created.append(f"schedule {DEMO_SCHEDULE_NAME!r} (paused)")

    generated_password: str | None = None
    if not manager.filter(**{user_model.USERNAME_FIELD: ADMIN_USERNAME}).exists():
        password = os.environ.get(ADMIN_PASSWORD_ENV, "")
        if not password:
            password = generated_password = secrets.token_urlsafe(12)
        manager.create_superuser(
            **{user_model.USERNAME_FIELD: ADMIN_USERNAME, "email": "", "password": password}
        )
        created.append(f"superuser {ADMIN_USERNAME}")
    return DemoSeedResult(
        created=created, admin_password=generated_password, demo_password=demo_password
    )
