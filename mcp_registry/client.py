"""The MCP client the Dex worker uses to discover and call tools on trusted MCP servers.

Django-free: the caller describes a server with an :class:`McpServerSpec` (the Django side builds
one from its ``McpServer`` row) and this module does the protocol work through the ``mcp`` SDK
(2.x ``mcp.Client``), for both transports.

* ``stdio``: the server command runs as a child process in its own process group (a new session).
  A small guard process sits between the worker and the server: it watches the worker and, should
  the worker die without closing the connection (even by SIGKILL), stops the whole group, SIGTERM
  first and SIGKILL two seconds later. It also reports how the server ended (exit code or
  signal). Normal shutdown follows the SDK: close stdin, wait, then SIGTERM and SIGKILL the group.
* ``streamable_http``: the server URL, with headers whose values are read from the environment.
  A clean close ends the server's MCP session with ``DELETE`` (MCP specification, "Transports/
  Session Management").

Credentials are referenced by environment-variable name in the spec and read from ``os.environ``
only when a connection opens; values are never stored on the spec, logged, or put in errors.

Connections are opened with the ``initialize`` handshake first (every released server answers
it); only a server that refuses it as a modern-only server (error -32022) is probed with
``server/discover``.

Isolation (docs/mcp-registry.md, "Isolation"): :class:`McpClientPool`
keeps one connection per server per *scope key*. Every request names an :class:`McpScope` (the
agent session and its owner), and the server's ``isolation`` decides the key: ``session`` (the
default: one connection, so one stdio process or one Streamable-HTTP ``Mcp-Session-Id``, per
agent session), ``user`` (one per owner, shared by that user's sessions) or ``shared`` (one for
the whole worker). A connection opens on its scope's first request and closes when it has been
idle for the server's ``idle_timeout``, when its agent session has ended (``sessions_ended``),
when the pool needs its slot for another (``max_processes`` bounds live stdio processes; the
least recently used idle one is closed first) or when the pool closes.
:func:`list_tools` opens a short-lived connection of its own for discovery.

Notifications (MCP specification, "Utilities/Progress", "Server features/Logging" and
"Server features/Tools/List Changed Notification"): progress for a call goes to that call's
``on_progress``. A log message names no request: on a ``session`` connection it goes to the
oldest call in flight (every call on it belongs to the same agent session); on a ``user``
connection to a call's ``on_log`` only while that call is the one request in flight (every
request there is the same user's); on a ``shared`` connection to no call, since any user's
request may have caused it. Otherwise it goes to the pool's ``on_log`` (the worker's
log), never to another user's call. A server's question (``elicitation/create``) is routed the
same way, and declined when no call owns it.
A ``notifications/tools/list_changed`` marks the server's catalogue stale and is passed to the
pool's ``on_tools_list_changed``.

Results: a ``tools/call`` result that arrived is the call's outcome, whatever happens to the
connection afterwards. Structured content is validated against the output schema stored at
discovery (``McpServerSpec.tool_output_schemas``), never by asking the server for its tool list
in the middle of a call.

Errors: :class:`McpToolError` carries a model-readable message (an ``isError`` result, a
JSON-RPC error the server answered with, a result that breaks its schema, or a call that was
not sent because the pool was full); :class:`McpTransportError` means no answer was obtained
(the server could not start, timed out, crashed or dropped the connection), which a caller
should treat as a retryable failure. Every message is plain prose: it names the server, the
request, how long a timeout waited, and for a crashed stdio server its exit code or signal and
the last lines of its stderr; never a Python class.

Parts: this module is the client's public face and holds no code of its own; every public name
of its parts is importable from here. Each part imports only those listed before it (and
``content``):

* ``_mcp_spec``: the server spec, the request scope, the discovered tool and the errors;
* ``_mcp_stdio``: stdio processes, their guard, stderr capture and exit status;
* ``_mcp_transport``: opening a transport and the handshake, ending a left-over HTTP session,
  and the prose of failures;
* ``_mcp_connection``: one connection, its owner task, and where a server's messages go;
* ``_mcp_discovery``: ``tools/list`` on a connection of its own (:func:`list_tools`);
* ``_mcp_call``: one ``tools/call`` apart from its connection (clock, relays, outcome);
* ``_mcp_pool``: the connections per scope key and the requests sent on them
  (:class:`McpClientPool`);

and ``content`` (what the model reads of a result), which imports none of them.
"""

from __future__ import annotations

# The client's parts live in private modules; this module is their public face.
from mcp_registry._mcp_call import structured_content_problem as structured_content_problem
from mcp_registry._mcp_connection import ElicitCallback as ElicitCallback
from mcp_registry._mcp_connection import HttpSessionCallback as HttpSessionCallback
from mcp_registry._mcp_connection import LogCallback as LogCallback
from mcp_registry._mcp_connection import McpHttpSession as McpHttpSession
from mcp_registry._mcp_connection import ProgressCallback as ProgressCallback
from mcp_registry._mcp_connection import ToolsChangedCallback as ToolsChangedCallback
from mcp_registry._mcp_discovery import list_tools as list_tools
from mcp_registry._mcp_pool import McpClientPool as McpClientPool
from mcp_registry._mcp_spec import IDEMPOTENCY_KEY_META as IDEMPOTENCY_KEY_META
from mcp_registry._mcp_spec import ISOLATION_LEVELS as ISOLATION_LEVELS
from mcp_registry._mcp_spec import DiscoveredTool as DiscoveredTool
from mcp_registry._mcp_spec import Isolation as Isolation
from mcp_registry._mcp_spec import McpClientError as McpClientError
from mcp_registry._mcp_spec import McpPoolFullError as McpPoolFullError
from mcp_registry._mcp_spec import McpScope as McpScope
from mcp_registry._mcp_spec import McpServerSpec as McpServerSpec
from mcp_registry._mcp_spec import McpToolError as McpToolError
from mcp_registry._mcp_spec import McpTransportError as McpTransportError
from mcp_registry._mcp_spec import Transport as Transport
from mcp_registry._mcp_spec import http_headers as http_headers
from mcp_registry._mcp_spec import scope_key as scope_key
from mcp_registry._mcp_stdio import STDERR_TAIL_LINES as STDERR_TAIL_LINES
from mcp_registry._mcp_stdio import McpProcessStatus as McpProcessStatus
from mcp_registry._mcp_stdio import ProcessState as ProcessState
from mcp_registry._mcp_stdio import ProcessStatusCallback as ProcessStatusCallback
from mcp_registry._mcp_stdio import exit_status_text as exit_status_text
from mcp_registry._mcp_stdio import with_stderr as with_stderr
from mcp_registry._mcp_transport import connection_failure_text as connection_failure_text
from mcp_registry._mcp_transport import http_session_end as http_session_end

# Rendering for the model lives in mcp_registry.content; these names stay importable from here.
from mcp_registry.content import McpResourceLink as McpResourceLink
from mcp_registry.content import McpToolOutput as McpToolOutput
from mcp_registry.content import render_block as render_block
from mcp_registry.content import render_content as render_content
from mcp_registry.content import structured_adds_information as structured_adds_information
