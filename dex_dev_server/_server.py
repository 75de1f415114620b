"""Process wiring: gRPC server lifecycle, ready line and signal-driven drain."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import grpc

from ._profile import EngineProfile
from ._service import Engine, add_services
from ._store import Store

_LOG = logging.getLogger("dex_dev_server")

_MAX_MESSAGE = 64 * 1024 * 1024


class EngineServer:
    """A running engine bound to ``host:port`` (``port=0`` picks a free port).

    Use :meth:`start` then :meth:`stop`, or :func:`serve` for the CLI lifecycle.
    """

    def __init__(
        self,
        db_path: str | Path,
        host: str = "127.0.0.1",
        port: int = 8801,
        *,
        synchronous: str = "normal",
        profile_path: str | Path | None = None,
        decline_backoff: float | None = None,
        blob_threshold: int | None = None,
    ) -> None:
        """Configure the engine; nothing opens before :meth:`start`.

        Args:
            db_path: The SQLite database file.
            host: Interface to listen on.
            port: TCP port; 0 picks a free one.
            synchronous: The store's durability, ``"normal"`` or ``"full"`` (``_store``).
            profile_path: Where :class:`EngineProfile` writes its figures; ``None`` for none.
            decline_backoff: Seconds a pull stream that declined a task is passed over;
                ``None`` keeps ``_state.NO_CAPACITY_BACKOFF`` (0.2).
            blob_threshold: Serialized size in bytes above which string and object values
                are stored as blobs (``_blobs``; 0: never); ``None`` keeps
                ``_blobs.DEFAULT_BLOB_THRESHOLD``.
        """
        self.db_path = str(db_path)
        self.blob_threshold = blob_threshold
        self.decline_backoff = decline_backoff
        self.host = host
        self.requested_port = port
        self.synchronous = synchronous
        self.profile_path = profile_path
        self.profile: EngineProfile | None = None
        self.port = 0
        self.store: Store | None = None
        self.engine: Engine | None = None
        self.server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        """``host:port`` actually served."""
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        """Open the database, resume all runs and start serving.

        Raises:
            RuntimeError: if the address cannot be bound.
        """
        self.store = Store(self.db_path, synchronous=self.synchronous)
        self.engine = Engine(self.store)
        if self.decline_backoff is not None:
            self.engine.decline_backoff = self.decline_backoff
        if self.blob_threshold is not None:
            self.engine.blob_threshold = self.blob_threshold
        self.engine.load()
        if self.profile_path is not None:
            self.profile = EngineProfile(self.profile_path, self.store.stats)
            self.profile.instrument(self.engine)
        self.server = grpc.aio.server(
            interceptors=[self.profile.interceptor()] if self.profile is not None else None,
            options=[
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
                ("grpc.max_send_message_length", _MAX_MESSAGE),
                ("grpc.so_reuseport", 0),
                # Ping idle connections so a worker host that vanished without closing
                # its TCP connection is detected and its in-flight task is failed.
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5000),
                ("grpc.http2.max_pings_without_data", 0),
            ]
        )
        add_services(self.engine, self.server)
        port = self.server.add_insecure_port(f"{self.host}:{self.requested_port}")
        if port == 0:
            raise RuntimeError(f"cannot bind {self.host}:{self.requested_port}")
        self.port = port
        await self.server.start()

    def dump_profile(self) -> None:
        """Write the profile (``--profile``); a path that cannot be written is logged."""
        if self.profile is None:
            return
        try:
            self.profile.dump()
        except OSError as exc:
            _LOG.error("cannot write the profile to %s: %s", self.profile.path, exc)

    async def stop(self, grace: float = 3.0) -> None:
        """Ask workers to reconnect, finish in-flight calls (up to ``grace`` s), close the DB."""
        if self.engine is not None:
            self.engine.shutdown_streams()
        if self.server is not None:
            await self.server.stop(grace)
        if self.engine is not None:
            await self.engine.push.close()
            self.engine.flush_streams()
        if self.profile is not None:
            self.dump_profile()
        if self.store is not None:
            self.store.close()
            self.store = None


#: ``gc.set_threshold`` of the engine process (Python's defaults are 700, 10, 10).
GC_THRESHOLDS = (10_000, 20, 20)


def _tune_garbage_collection() -> None:
    """Fewer, cheaper collections for a process that keeps every live run in memory.

    What was loaded at start-up moves to the permanent generation (``gc.freeze``), so no
    collection scans it again, and the young generation collects every 10,000 allocations
    instead of 700: with the defaults the engine spent about 1.5 ms of each agent turn in the
    collector, with single pauses longer than a Step transition (``bench/turn.py``).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _on_sigusr1(server: EngineServer) -> None:
    """Write the profile, or say why there is none (SIGUSR1 would otherwise end the process)."""
    if server.profile is None:
        _LOG.warning("SIGUSR1: profiling is off (start the engine with --profile PATH)")
        return
    server.dump_profile()


async def serve(
    db_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 8801,
    on_ready: Callable[[EngineServer], None] | None = None,
    *,
    synchronous: str = "normal",
    profile_path: str | Path | None = None,
    decline_backoff: float | None = None,
    blob_threshold: int | None = None,
) -> None:
    """Run the engine until SIGTERM or SIGINT, then drain and return.

    With ``profile_path``, SIGUSR1 writes the :class:`EngineProfile` there. The keyword
    arguments are :class:`EngineServer`'s.
    """
    server = EngineServer(
        db_path, host, port, synchronous=synchronous, profile_path=profile_path,
        decline_backoff=decline_backoff, blob_threshold=blob_threshold,
    )
    await server.start()
    _tune_garbage_collection()
    if server.profile is not None:
        server.profile.reset_gc()  # the start-up collection is not a pause of the service
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: _on_sigusr1(server))
    if on_ready is not None:
        on_ready(server)
    else:
        print(f"dex_dev_server ready on {server.address}", flush=True)
    _LOG.info("serving on %s with database %s", server.address, db_path)
    try:
        await stop.wait()
    finally:
        _LOG.info("draining")
        await server.stop()
        sys.stdout.flush()
