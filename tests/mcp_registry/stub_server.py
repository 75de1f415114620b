"""A stdio MCP server of a few lines that misbehaves on request, for the client's tests.

It speaks newline-delimited JSON-RPC by hand (no SDK), so it can do what a real SDK would not:
answer a call and exit, never answer ``tools/list``, ignore ``server/discover``, exit with a
code in the middle of a call. Run it as ``python tests/mcp_registry/stub_server.py OPTIONS``:

``--journal PATH``      append one JSON line per request received (method, id, params)
``--exit-after-call``   exit (code 0) right after answering the first ``tools/call`` (journalled
                        as the method ``exit``)
``--ignore-list``       never answer ``tools/list``
``--answer-discover``   answer ``server/discover`` with "method not found" (default: ignore it)
``--crash-in-call N``   during ``tools/call``, write two stderr lines and exit with code N
``--hang-call``         never answer ``tools/call`` (it is still journalled; so is a cancel)
``--output-schema``     list ``echo`` with an output schema and answer with structured content
``--bad-structured``    answer ``echo`` with structured content that breaks that schema
``--pad N``             answer ``echo`` with its text followed by N more characters
``--pad-text S``        pad with ``S`` repeated (default ``.``)
``--delay S``           wait S seconds before answering ``tools/call``
``--error-code N``      answer ``tools/call`` with a JSON-RPC error of code N
``--odd-schemas``       also list tools whose ``inputSchema`` the MCP schema refuses: ``anything``
                        (``{}``), ``either`` (a top-level ``oneOf``), ``broken`` (a string)

Its one tool, ``echo``, answers ``{"text": <arguments.text>}``; ``pid`` answers its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def padded_echo_yaml(name: str, pad: int, pad_text: str, *, call_timeout: int | None = None
                     ) -> str:
    """``manage.py mcp_import`` YAML registering this stub as the trusted stdio server
    ``name`` whose ``echo`` answers its text followed by ``pad`` characters of ``pad_text``
    repeated (``--pad`` / ``--pad-text``)."""
    args = [os.path.abspath(__file__), "--pad", str(pad), "--pad-text", pad_text]
    timeout = f"    call_timeout: {call_timeout}\n" if call_timeout is not None else ""
    return (
        f"servers:\n  - name: {name}\n    transport: stdio\n    command: {sys.executable}\n"
        f"    args: {json.dumps(args, ensure_ascii=False)}\n    trust_annotations: true\n"
        f"{timeout}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--journal")
    parser.add_argument("--exit-after-call", action="store_true")
    parser.add_argument("--ignore-list", action="store_true")
    parser.add_argument("--answer-discover", action="store_true")
    parser.add_argument("--crash-in-call", type=int)
    parser.add_argument("--hang-call", action="store_true")
    parser.add_argument("--output-schema", action="store_true")
    parser.add_argument("--bad-structured", action="store_true")
    parser.add_argument("--pad", type=int, default=0)
    parser.add_argument("--pad-text", default=".")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--error-code", type=int)
    parser.add_argument("--odd-schemas", action="store_true")
    options = parser.parse_args()

    def journal(message: dict[str, Any]) -> None:
        if options.journal:
            with open(options.journal, "a", encoding="utf-8") as file:
                file.write(json.dumps(message) + "\n")

    def send(message: dict[str, Any]) -> None:
        # UTF-8 without escapes, as the MCP SDKs write (and 3 to 6 times shorter for non-ASCII).
        sys.stdout.buffer.write(json.dumps(message, ensure_ascii=False).encode() + b"\n")
        sys.stdout.flush()

    def answer(request_id: Any, result: dict[str, Any]) -> None:
        send({"jsonrpc": "2.0", "id": request_id, "result": result})

    tool: dict[str, Any] = {
        "name": "echo",
        "description": "Echo the text.",
        "inputSchema": SCHEMA,
        "annotations": {"readOnlyHint": True},
    }
    if options.output_schema or options.bad_structured:
        tool["outputSchema"] = SCHEMA
    pid_tool = {"name": "pid", "inputSchema": {"type": "object"}}
    listed = [tool, pid_tool]
    if options.odd_schemas:
        listed += [
            {"name": "anything", "description": "Takes any arguments.", "inputSchema": {}},
            {"name": "either", "inputSchema": {"oneOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]},
            ]}},
            {"name": "broken", "inputSchema": "not a schema"},
        ]

    for line in sys.stdin:
        message = json.loads(line)
        journal(message)
        method = message.get("method")
        request_id = message.get("id")
        if request_id is None:
            continue  # a notification
        if method == "initialize":
            answer(request_id, {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}, "logging": {}},
                "serverInfo": {"name": "stub", "version": "1"},
            })
        elif method == "server/discover":
            if options.answer_discover:
                send({"jsonrpc": "2.0", "id": request_id,
                      "error": {"code": -32601, "message": "Method not found"}})
        elif method == "tools/list":
            if not options.ignore_list:
                answer(request_id, {"tools": listed})
        elif method == "tools/call":
            name = message["params"]["name"]
            arguments = message["params"].get("arguments") or {}
            if options.crash_in_call is not None:
                sys.stderr.write("stub: about to fail\nstub: disk is on fire\n")
                sys.stderr.flush()
                os._exit(options.crash_in_call)
            if options.hang_call:
                continue
            if options.delay:
                time.sleep(options.delay)
            if options.error_code is not None:
                send({"jsonrpc": "2.0", "id": request_id,
                      "error": {"code": options.error_code, "message": "the stub refuses"}})
                continue
            if name == "pid":
                answer(request_id, {"content": [{"type": "text", "text": str(os.getpid())}]})
            else:
                repeats = -(-options.pad // len(options.pad_text))
                text = str(arguments.get("text", "")) + (options.pad_text * repeats)[:options.pad]
                result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
                if options.bad_structured:
                    result["structuredContent"] = {"text": 42}
                elif options.output_schema:
                    result["structuredContent"] = {"text": text}
                answer(request_id, result)
            if options.exit_after_call:
                sys.stdout.flush()
                journal({"method": "exit"})
                os._exit(0)
        elif method == "ping":
            answer(request_id, {})
        else:
            send({"jsonrpc": "2.0", "id": request_id,
                  "error": {"code": -32601, "message": "Method not found"}})


if __name__ == "__main__":
    main()
