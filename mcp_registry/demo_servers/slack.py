"""A credential-free demo "Slack" MCP server over stdio: ``search_messages`` and ``post_message``.

Run it with ``python -m mcp_registry.demo_servers.slack``. A few seeded messages live in this
module; posted ones are appended to ``slack_messages.json`` in the demo state directory
(``mcp_registry.demo_servers.state``), so every post can be observed and counted. Posting is a
non-idempotent write: posting the same text twice leaves two messages.
"""

from __future__ import annotations

import warnings
from datetime import UTC, datetime
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from mcp_registry.demo_servers.state import state_locked, state_read, state_write

# Log messages are deprecated from protocol 2026-07-28 on but still delivered to clients that
# opt in; the warning would only clutter the worker's stderr.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

SERVER_NAME = "dexagents-demo-slack"
STATE_FILE = "slack_messages.json"
CHANNELS = ("general", "engineering", "random")
MAX_RESULTS = 5
SEED_MESSAGES: list[dict[str, Any]] = [
    {"id": "m-1", "channel": "general", "user": "ada",
     "text": "Welcome to the demo workspace! Durable agents live here."},
    {"id": "m-2", "channel": "engineering", "user": "grace",
     "text": "The Dex engine retries reads; writes wait for approval."},
    {"id": "m-3", "channel": "engineering", "user": "linus",
     "text": "Deploy of the MCP registry is scheduled for Friday."},
    {"id": "m-4", "channel": "random", "user": "ada", "text": "Lunch at noon, anyone?"},
]

server = MCPServer(
    SERVER_NAME,
    instructions=f"Demo chat workspace with channels {', '.join(CHANNELS)}; state in var/.",
)


def messages_all() -> list[dict[str, Any]]:
    """The seeded messages followed by every posted one, oldest first."""
    return [*SEED_MESSAGES, *state_read(STATE_FILE, [])]


@server.tool(
    name="search_messages",
    title="Search messages",
    description="Search the demo chat workspace for messages containing every word of the query.",
    annotations=ToolAnnotations(
        title="Search messages", read_only_hint=True, idempotent_hint=True, open_world_hint=False
    ),
)
def search_messages(
    query: str, channel: str | None = None, limit: int = MAX_RESULTS
) -> CallToolResult:
    """Return up to ``limit`` (1 to 5) messages, newest first, whose text contains every word
    of ``query`` (case-insensitive), optionally only in ``channel``.

    Structured content: ``{"query", "messages": [{"id", "channel", "user", "text"}]}``.
    """
    words = query.lower().split()
    found = [
        message
        for message in reversed(messages_all())
        if all(word in message["text"].lower() for word in words)
        and (channel is None or message["channel"] == channel.lstrip("#"))
    ][: min(max(limit, 1), MAX_RESULTS)]
    lines = [f'Messages matching "{query}": {len(found)}']
    lines += [f"#{m['channel']} {m['user']}: {m['text']} ({m['id']})" for m in found]
    return CallToolResult(
        content=[TextContent(type="text", text="\n".join(lines))],
        structured_content={"query": query, "messages": found},
    )


@server.tool(
    name="post_message",
    title="Post a message",
    description="Post a message to a channel of the demo chat workspace (general, engineering, "
    "random). Each call posts a new message.",
    annotations=ToolAnnotations(
        title="Post a message",
        read_only_hint=False,
        destructive_hint=False,
        idempotent_hint=False,
        open_world_hint=False,
    ),
)
async def post_message(channel: str, text: str, ctx: Context) -> CallToolResult:
    """Append a message by ``dexagents`` to ``channel`` and return its id.

    Reports progress (1 of 2 before writing, 2 of 2 after) and logs the post at ``info``.
    An unknown channel is an ``isError`` result naming the channels.
    """
    name = channel.lstrip("#")
    if name not in CHANNELS:
        return CallToolResult(
            content=[TextContent(
                type="text",
                text=f"Unknown channel {channel!r}; use one of {', '.join(CHANNELS)}.",
            )],
            is_error=True,
        )
    await ctx.report_progress(1, 2, f"posting to #{name}")
    with state_locked(STATE_FILE) as path:
        posted = state_read(STATE_FILE, [])
        message = {
            "id": f"p-{len(posted) + 1}",
            "channel": name,
            "user": "dexagents",
            "text": text,
            "posted_at": datetime.now(UTC).isoformat(),
        }
        state_write(path, [*posted, message])
    await ctx.info(f"posted {message['id']} to #{name}")
    await ctx.report_progress(2, 2, "posted")
    return CallToolResult(
        content=[TextContent(type="text", text=f"Posted {message['id']} to #{name}.")],
        structured_content=message,
    )


def main() -> None:
    """Serve the demo chat tools over stdio until stdin closes."""
    server.run("stdio")


if __name__ == "__main__":
    main()
