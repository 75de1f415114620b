"""``manage.py dev``'s shared listening socket: the connections its web processes accept send
small answers at once.

uvicorn takes the socket with ``--fd`` and wraps it as a Unix socket, so its event loop never
sets TCP_NODELAY on accepted connections; they inherit it from the listener (Linux), which
``listening_socket`` sets. Without it a kept-alive connection's answers, written in two sends,
waited about 40 ms each for the client's delayed ACK.
"""

from __future__ import annotations

import socket

from agents_app.management.commands.dev import listening_socket


def test_accepted_connections_have_tcp_nodelay() -> None:
    listener = listening_socket("127.0.0.1", 0)
    try:
        assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        client = socket.create_connection(listener.getsockname()[:2], timeout=5)
        accepted, _ = listener.accept()
        # As uvicorn sees the inherited descriptor: nothing sets the option again.
        with client, accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        listener.close()
