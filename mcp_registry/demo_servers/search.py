"""A credential-free demo MCP server with one read-only tool, ``web_search``, over stdio.

Run it with ``python -m mcp_registry.demo_servers.search``; it speaks MCP on stdin/stdout and
exits when stdin closes. The results are fake and deterministic: each quotes the query verbatim,
so a test or a demo can see that the tool really ran with the model's arguments.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

SERVER_NAME = "dexagents-demo-search"
MAX_RESULTS = 3

server = MCPServer(
    SERVER_NAME,
    instructions="Demo web search: deterministic fake results that quote the query.",
)


def search_results(query: str, limit: int = MAX_RESULTS) -> list[dict[str, str]]:
    """Return ``min(max(limit, 1), 3)`` fake results for ``query``, each quoting it verbatim.

    Each result is ``{"title": str, "url": str, "snippet": str}``. Pure and deterministic.
    """
    slug = "-".join(query.lower().split()) or "empty"
    results = [
        {
            "title": f"{query} — Overview",
            "url": f"https://example.com/search/{slug}/overview",
            "snippet": f'An introduction to "{query}" and why it matters.',
        },
        {
            "title": f"{query} — Frequently asked questions",
            "url": f"https://example.com/search/{slug}/faq",
            "snippet": f'Common questions people ask about "{query}", answered.',
        },
        {
            "title": f"{query} — Latest news",
            "url": f"https://example.com/search/{slug}/news",
            "snippet": f'Recent articles that mention "{query}".',
        },
    ]
    return results[: min(max(limit, 1), MAX_RESULTS)]


def render_results(query: str, results: list[dict[str, str]]) -> str:
    """Render ``results`` as numbered plain text a model can read."""
    lines = [f'Search results for "{query}":']
    for number, result in enumerate(results, start=1):
        lines.append(f"{number}. {result['title']} ({result['url']})\n   {result['snippet']}")
    return "\n".join(lines)


@server.tool(
    name="web_search",
    title="Web search",
    description="Search the web (demo data) and return up to three results that quote the query.",
    annotations=ToolAnnotations(
        title="Web search",
        read_only_hint=True,
        idempotent_hint=True,
        open_world_hint=False,
    ),
)
def web_search(query: str, limit: int = MAX_RESULTS) -> CallToolResult:
    """Search the demo index for ``query``; ``limit`` caps the number of results (1 to 3).

    The result carries the rendered text for the model and ``{"query", "results"}`` as
    structured content.
    """
    results = search_results(query, limit)
    return CallToolResult(
        content=[TextContent(type="text", text=render_results(query, results))],
        structured_content={"query": query, "results": results},
    )


def main() -> None:
    """Serve the demo search tool over stdio until stdin closes."""
    server.run("stdio")


if __name__ == "__main__":
    main()
