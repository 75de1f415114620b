"""A Streamable-HTTP MCP server of a few lines that misbehaves on request, for the client's
tests: the HTTP twin of ``stub_server.py``.

It answers each JSON-RPC POST with a plain JSON body (the transport allows that instead of an
SSE stream), assigns an ``Mcp-Session-Id`` at ``initialize`` and journals every request, the
``DELETE`` that ends a session included. Run it as
``python tests/mcp_registry/stub_http_server.py --journal PATH [--ignore-list] [--hang-call]
[--ignore-discover]``; it prints its port, then serves until killed.

``--ignore-list``      never answer ``tools/list`` (the request hangs)
``--hang-call``        never answer ``tools/call``
``--ignore-discover``  never answer ``server/discover`` (by default it is "method not found")
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import uuid
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TOOL = {
    "name": "echo",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    "annotations": {"readOnlyHint": True},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--journal", required=True)
    parser.add_argument("--ignore-list", action="store_true")
    parser.add_argument("--hang-call", action="store_true")
    parser.add_argument("--ignore-discover", action="store_true")
    options = parser.parse_args()

    def journal(entry: dict[str, Any]) -> None:
        with open(options.journal, "a", encoding="utf-8") as file:
            file.write(json.dumps(entry) + "\n")

    async def never() -> Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def mcp(request: Request) -> Response:
        session = request.headers.get("mcp-session-id")
        if request.method == "DELETE":
            journal({"method": "DELETE", "session": session})
            return Response(status_code=200)
        if request.method == "GET":
            return Response(status_code=405)
        message = await request.json()
        journal({**message, "session": session})
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            return Response(status_code=202)
        headers: dict[str, str] = {}
        result: dict[str, Any]
        if method == "initialize":
            headers["mcp-session-id"] = uuid.uuid4().hex
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "stub-http", "version": "1"},
            }
        elif method == "server/discover" and options.ignore_discover:
            return await never()
        elif method == "tools/list":
            if options.ignore_list:
                return await never()
            result = {"tools": [TOOL]}
        elif method == "tools/call":
            if options.hang_call:
                return await never()
            text = str((message["params"].get("arguments") or {}).get("text", ""))
            result = {"content": [{"type": "text", "text": text}]}
        else:
            return JSONResponse({"jsonrpc": "2.0", "id": request_id,
                                 "error": {"code": -32601, "message": "Method not found"}})
        return JSONResponse({"jsonrpc": "2.0", "id": request_id, "result": result},
                            headers=headers)

    app = Starlette(routes=[Route("/mcp", mcp, methods=["GET", "POST", "DELETE"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is printed: a client that connects before uvicorn has started
    # waits in the backlog instead of being refused.
    sock.listen(128)
    print(sock.getsockname()[1], flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
