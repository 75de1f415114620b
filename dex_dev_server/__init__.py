"""dex_dev_server: an embedded, Dex-compatible durable-execution engine on SQLite.

The unchanged ``dex-python-sdk`` (Client, AsyncClient, pull-mode Worker/AsyncWorker) talks to
it over gRPC exactly as to a real Dex server. Run it with::

    python -m dex_dev_server --host 127.0.0.1 --port 8801 --db var/dex.sqlite3

or embed it with :class:`EngineServer`. Behaviour follows the Dex engine spec
(``reference/dex-engine-spec.md``), sections 1-4 and the corrections in section 9.
"""

from ._server import EngineServer, serve
from ._service import SERVER_VERSION, Engine

__all__ = ["SERVER_VERSION", "Engine", "EngineServer", "serve"]
__version__ = "0.1.0"
