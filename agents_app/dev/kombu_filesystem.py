"""kombu's ``filesystem://`` Celery broker, made safe for a consumer that reads while a
producer writes, and for a producer killed while it writes.

kombu's filesystem transport (kombu 5.x, ``kombu/transport/filesystem.py``) creates a message
file in the queue folder under its final name and only then writes the message into it; a
consumer never takes the writer's lock, it moves every file whose name ends in
``.<queue>.msg`` out of the folder and decodes it. A consumer that lists the folder between
the open and the write reads an empty file, and the ``json.JSONDecodeError`` ends the Celery
worker (exit code 1; kombu issue #1551). A producer SIGKILLed between them (a web process or a
Dex worker, which both queue tasks) leaves such an empty file behind for good. ``make chaos``
lost its Celery worker that way while Dex workers were killed, and with it the delivery of
messages the web had kept for later.

The exchange tables (``<control_folder>/<exchange>.exchange``, which queues an exchange
routes to) have the same gap: a process declaring a queue creates a missing table file and
only then takes its lock and writes, so another process declaring its queue at that moment
(a Celery worker starting while a web process queues its first task) reads an empty table and
the worker ends on the same ``JSONDecodeError``; two that both find no file truncate each
other's entry.

This transport changes three things and nothing else:

* a producer writes the message to ``.<name>.part`` in the same folder, a name no consumer
  takes (it does not end in ``.<queue>.msg``), and renames it to its final name, which is
  atomic within one file system: a consumer sees a whole message or none;
* an exchange table is opened (or created) in one step, locked, and only then read and
  rewritten; an empty table file counts as an exchange with no queues;
* a consumer that still meets a file it cannot decode (one left by kombu's own transport, or
  a disk that filled up) logs it at ERROR with its queue and drops it, and takes the next.

Use it with ``CELERY_BROKER_URL = "filesystem://localhost//"`` and
``CELERY_BROKER_TRANSPORT = "agents_app.dev.kombu_filesystem:Transport"``; the transport options
are kombu's (``data_folder_in``, ``data_folder_out``, ``processed_folder``,
``control_folder``, ``store_processed``, ``polling_interval``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import uuid
from pathlib import Path
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

logger = logging.getLogger(__name__)

#: Suffix of a message file still being written; no consumer takes it.
PARTIAL_SUFFIX = ".part"


def _table_rows(raw: bytes) -> list[tuple[str, str, str]]:
    """The rows of an exchange table file's bytes; no bytes (a file just created) is no rows.

    Raises:
        ValueError: If the bytes are not kombu's JSON list of ``[routing_key, pattern, queue]``.
    """
    if not raw.strip():
        return []
    return [filesystem.exchange_queue_t(*row) for row in loads(bytes_to_str(raw))]


class Channel(filesystem.Channel):
    """kombu's filesystem channel with whole-file puts, locked exchange tables, and gets that
    skip undecodable files."""

    def _table_path(self, exchange: str) -> Path:
        """The table file of ``exchange``, through kombu's own name check.

        Raises:
            kombu.exceptions.ChannelError: If the exchange name could leave the control folder.
        """
        path: Path = self._exchange_file(exchange)  # type: ignore[attr-defined]  # kombu 5.6+
        return path

    # The stubs of kombu's filesystem and virtual Channels disagree on the row type.
    def get_table(  # type: ignore[override]
        self, exchange: str
    ) -> list[tuple[str, str, str]]:
        """The queues bound to ``exchange`` (kombu's ``exchange_queue_t`` rows), read under a
        shared lock; a missing or empty table file is no queues.

        Raises:
            kombu.exceptions.ChannelError: If the exchange name is invalid or the file cannot be
                read (as kombu's).
        """
        path = self._table_path(exchange)
        try:
            with open(path, "rb") as handle:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
                try:
                    return _table_rows(handle.read())
                finally:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {path}") from exc

    def _queue_bind(
        self, exchange: str, routing_key: str | None, pattern: str | None, queue: str | None
    ) -> None:
        """Add ``queue`` to ``exchange``'s table file unless it is there, under an exclusive
        lock taken before the file is read (kombu's creates a missing file and writes it before
        the lock is held, so a second process could read it empty).

        Raises:
            kombu.exceptions.ChannelError: If the exchange name is invalid or the file cannot be
                opened (as kombu's).
        """
        path = self._table_path(exchange)
        self.control_folder.mkdir(exist_ok=True)
        row = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            with os.fdopen(descriptor, "rb+", buffering=0) as handle:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                try:
                    rows = _table_rows(handle.read())
                    if row not in rows:
                        rows.insert(0, row)
                        handle.seek(0)
                        handle.write(str_to_bytes(dumps(rows)))
                        handle.truncate()
                finally:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        except OSError as exc:
            raise ChannelError(f"Cannot open {path}") from exc

    # kombu's filesystem Channel names its argument ``payload`` where kombu's AbstractChannel
    # names it ``message``; kombu passes it by position.
    def _put(  # type: ignore[override]
        self, queue: str, payload: dict[str, Any], **kwargs: Any
    ) -> None:
        """Write ``payload`` (a kombu message dict) as one new message file of ``queue``.

        The name is kombu's (``<monotonic ms>_<uuid4>.<queue>.msg``, so consumers take files
        in the order kombu's would); the file appears under it only once fully written.

        Raises:
            kombu.exceptions.ChannelError: If the file cannot be written or renamed (as kombu's).
        """
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}{PARTIAL_SUFFIX}")
        try:
            with open(partial, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        """The next decodable message of ``queue``, dropping (and logging) undecodable files.
        ``timeout`` is unused, as in kombu's (the virtual transport polls).

        Raises:
            queue.Empty: If ``queue`` has no message file (as kombu's).
            kombu.exceptions.ChannelError: If a taken file cannot be read (as kombu's).
        """
        while True:
            try:
                return super()._get(queue)
            except ValueError as error:  # json.JSONDecodeError and UnicodeDecodeError
                # kombu's _get has already taken the file out of the queue folder.
                logger.error(
                    "dropped a message file of queue %r that is not a whole message: %s",
                    queue,
                    error,
                )


class Transport(filesystem.Transport):
    """kombu's filesystem transport with :class:`Channel`."""

    Channel = Channel
