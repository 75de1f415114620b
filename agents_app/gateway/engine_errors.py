"""The errors of the web side's Dex calls, and the translation of the SDK's errors into them.

Owns: the exceptions the gateway's calls raise (``EngineUnavailableError``
and its ``WorkerUnavailableError``, ``SessionNotFoundError``, ``SessionTooLargeError``,
``MessageNotFoundError``, ``MessagePartOutOfRangeError``) and ``translate``, which maps a Dex
SDK or gRPC error to them in one place (reference/dex-engine-spec.md for the status codes).
Callers catch them as ``dex_gateway.<Error>``, where they are re-exported.

May import: the settings (``agents_app.conf``), grpc and the Dex SDK; nothing else of the
gateway, so every other gateway module can import it.
"""

from __future__ import annotations

import grpc

from agents_app.conf import dexagents_setting


class EngineUnavailableError(Exception):
    """The Dex engine could not be reached or did not answer in time.

    Attributes:
        cause: ``"unreachable"`` (the engine refused or dropped the connection: it is down),
            ``"timeout"`` (no answer in time: the engine is slow, or no Dex worker runs the
            RPC, since Dex RPCs execute on a worker), ``"worker"`` (``WorkerUnavailableError``:
            the engine said no worker took the RPC) or ``"busy"`` (a Step held the
            session's state locked for the client's whole retry window).
    """

    def __init__(self, message: str, *, cause: str = "unreachable") -> None:
        super().__init__(message)
        self.cause = cause


class WorkerUnavailableError(EngineUnavailableError):
    """The engine answered, but no Dex worker took the RPC (none connected, or it went away
    while running it): RPCs need a worker, unlike reads of Flow state."""


class SessionNotFoundError(Exception):
    """Dex has no Flow with the requested session ID."""


class SessionAlreadyStartedError(Exception):
    """Dex already has a Flow with the session ID a start named (gRPC ALREADY_EXISTS): a
    start with a deterministic ID (``session_create(session_id=)``) that was repeated."""


class SessionTooLargeError(Exception):
    """The engine cannot hand what a read needs to a worker, or its answer to the client, in
    one 4 MiB gRPC message.

    Values past the engine's blob threshold travel as blob references, the views
    (``dex_agents._views``) bound what a snapshot or a page carries, and one stored value is at
    most about 4 MiB, so a session within the documented limits (docs/limits.md) never gets
    here; a read that does answers 503 with this.
    """


class MessageNotFoundError(Exception):
    """The session stores no message with the requested sequence (any more)."""

    def __init__(self, sequence: int) -> None:
        super().__init__(f"The session has no message {sequence}.")
        self.sequence = sequence


class MessagePartOutOfRangeError(Exception):
    """The requested part of a message's text does not exist; ``parts`` says how many do."""

    def __init__(self, part: int, parts: int) -> None:
        super().__init__(f"The text has {parts} part(s), numbered from 0; there is no part {part}.")
        self.part = part
        self.parts = parts


def _unavailable_cause(error: BaseException) -> str | None:
    """``"unreachable"`` or ``"timeout"`` when ``error`` (or one of its causes) says the engine
    did not answer, else None (the request itself failed)."""
    from dex import DexServiceError

    seen: BaseException | None = error
    while seen is not None:
        code = None
        if isinstance(seen, DexServiceError):
            code = seen.code
        elif isinstance(seen, grpc.RpcError):
            code = seen.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            return "unreachable"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED or isinstance(seen, TimeoutError):
            return "timeout"
        if isinstance(seen, ConnectionError):
            return "unreachable"
        seen = seen.__cause__ or seen.__context__
    return None


def translate(error: Exception, session_id: str | None) -> Exception:
    """Map an error a Dex call raised for ``session_id`` to this module's errors.

    Returns:
        ``SessionNotFoundError`` (no such Flow, or gRPC NOT_FOUND),
        ``SessionAlreadyStartedError`` (a start found the Flow ID taken), ``SessionTooLargeError``
        (RESOURCE_EXHAUSTED), ``EngineUnavailableError`` (unreachable, or no answer in time),
        ``WorkerUnavailableError`` (no worker took the RPC), else ``error`` itself. The caller
        raises it ``from error``.
    """
    from dex import (
        DexServiceError,
        FlowAlreadyStartedError,
        FlowNotActiveOrNotFoundError,
        FlowNotFoundError,
    )

    if isinstance(error, FlowAlreadyStartedError):
        return SessionAlreadyStartedError(session_id or "")
    if isinstance(error, (FlowNotFoundError, FlowNotActiveOrNotFoundError)):
        return SessionNotFoundError(session_id or "")
    if isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.NOT_FOUND:
        return SessionNotFoundError(session_id or "")
    if isinstance(error, DexServiceError) and error.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return SessionTooLargeError(error.detail)
    if isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # A history page of large values passes the client's 4 MiB receive limit.
        return SessionTooLargeError(str(error.details()))
    cause = _unavailable_cause(error)
    if cause == "unreachable":
        address = dexagents_setting("DEX_SERVER_ADDRESS")
        return EngineUnavailableError(f"The Dex engine at {address} is not reachable.")
    if _no_worker_ran(error):
        return WorkerUnavailableError(
            f"No Dex worker took the request ({getattr(error, 'detail', error)}); try again "
            "shortly.",
            cause="worker",
        )
    if cause == "timeout":
        address = dexagents_setting("DEX_SERVER_ADDRESS")
        return EngineUnavailableError(
            f"The Dex engine at {address} or its workers did not answer in time.",
            cause="timeout",
        )
    return error


def _no_worker_ran(error: Exception) -> bool:
    """An RPC that no worker ran: FAILED_PRECONDITION without a worker's own status (the
    engine found no worker, or the worker went away before answering)."""
    from dex import WorkerInvocationError

    return (
        isinstance(error, WorkerInvocationError)
        and error.code == grpc.StatusCode.FAILED_PRECONDITION
        and error.worker_code is None
    )

