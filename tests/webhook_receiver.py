"""A real local HTTP endpoint for webhook tests: a thread of the test process that answers
given statuses in turn (then 200) and keeps every request it got."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Receiver:
    """What the endpoint answers (``statuses``, consumed in turn) and what it got
    (``requests``: each ``{"path", "headers", "body"}``)."""

    statuses: list[int] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/dexagents?x=1"


@contextlib.contextmanager
def running_receiver() -> Iterator[Receiver]:
    """Serve a ``Receiver`` on a free loopback port until the block ends."""
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.requests.append({"path": self.path, "headers": dict(self.headers),
                                   "body": body})
            status = state.statuses.pop(0) if state.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
