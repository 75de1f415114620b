"""A credential-free demo "Docs" MCP server over stdio: ``search_documents`` and
``create_document``, plus each document as a resource and a ``summarize_document`` prompt.

Run it with ``python -m mcp_registry.demo_servers.docs``. Documents are stored by title in
``docs_documents.json`` in the demo state directory (``mcp_registry.demo_servers.state``).
Creating is an idempotent write keyed by title: creating a title that exists changes nothing
and returns the existing document.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from mcp_registry.demo_servers.state import state_locked, state_read, state_write

SERVER_NAME = "dexagents-demo-docs"
STATE_FILE = "docs_documents.json"
MAX_RESULTS = 5
MAX_TITLE_CHARS = 200

server = MCPServer(SERVER_NAME, instructions="Demo document store; documents keyed by title.")


def documents_all() -> dict[str, dict[str, Any]]:
    """Every stored document by title: ``{title: {"title", "body", "uri", "created_at"}}``."""
    documents: dict[str, dict[str, Any]] = state_read(STATE_FILE, {})
    return documents


def document_uri(title: str) -> str:
    """The resource URI of the document called ``title``."""
    return f"docs://documents/{quote(title, safe='')}"


@server.tool(
    name="search_documents",
    title="Search documents",
    description="Search the demo document store for documents whose title or body contains "
    "every word of the query.",
    annotations=ToolAnnotations(
        title="Search documents", read_only_hint=True, idempotent_hint=True, open_world_hint=False
    ),
)
def search_documents(query: str, limit: int = MAX_RESULTS) -> CallToolResult:
    """Return up to ``limit`` (1 to 5) matching documents, by title.

    Structured content: ``{"query", "documents": [{"title", "uri", "snippet"}]}``.
    """
    words = query.lower().split()
    found = [
        {"title": doc["title"], "uri": doc["uri"], "snippet": doc["body"][:120]}
        for title, doc in sorted(documents_all().items())
        if all(word in f"{title} {doc['body']}".lower() for word in words)
    ][: min(max(limit, 1), MAX_RESULTS)]
    lines = [f'Documents matching "{query}": {len(found)}']
    lines += [f"- {doc['title']} <{doc['uri']}>: {doc['snippet']}" for doc in found]
    return CallToolResult(
        content=[TextContent(type="text", text="\n".join(lines))],
        structured_content={"query": query, "documents": found},
    )


@server.tool(
    name="create_document",
    title="Create a document",
    description="Create a document with a title and a body. Creating a title that already "
    "exists changes nothing and returns the existing document.",
    annotations=ToolAnnotations(
        title="Create a document",
        read_only_hint=False,
        destructive_hint=False,
        idempotent_hint=True,
        open_world_hint=False,
    ),
)
def create_document(title: str, body: str) -> CallToolResult:
    """Store ``body`` under ``title`` unless the title exists; return the stored document.

    Structured content: ``{"title", "body", "uri", "created_at", "created": bool}``. A blank
    or over-long title is an ``isError`` result.
    """
    title = title.strip()
    if not title or len(title) > MAX_TITLE_CHARS:
        return CallToolResult(
            content=[TextContent(
                type="text", text=f"A title needs 1 to {MAX_TITLE_CHARS} characters."
            )],
            is_error=True,
        )
    with state_locked(STATE_FILE) as path:
        documents = documents_all()
        created = title not in documents
        if created:
            documents[title] = {
                "title": title,
                "body": body,
                "uri": document_uri(title),
                "created_at": datetime.now(UTC).isoformat(),
            }
            state_write(path, documents)
    document = documents[title]
    verb = "Created" if created else "Already exists:"
    return CallToolResult(
        content=[TextContent(type="text", text=f"{verb} {title} <{document['uri']}>")],
        structured_content={**document, "created": created},
    )


@server.resource(
    "docs://documents/{title}",
    name="document",
    description="One document of the demo store, by URL-encoded title.",
    mime_type="text/markdown",
)
def document_read(title: str) -> str:
    """The document as Markdown (``# title`` then the body).

    Raises:
        ResourceNotFoundError: No document has that title (MCP "Resources/Error Handling":
            the client sees a resource-not-found error with this message).
    """
    document = documents_all().get(unquote(title))
    if document is None:
        raise ResourceNotFoundError(f"No document is titled {unquote(title)!r}.")
    return f"# {document['title']}\n\n{document['body']}"


@server.prompt(name="summarize_document", description="Ask for a summary of one document.")
def summarize_document(title: str) -> str:
    """A user message asking to summarise the document ``title`` in three bullet points."""
    return f"Summarise the document {title!r} ({document_uri(title)}) in three bullet points."


def main() -> None:
    """Serve the demo document tools over stdio until stdin closes."""
    server.run("stdio")


if __name__ == "__main__":
    main()
