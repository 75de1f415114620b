"""How the API's session endpoints find the URL's session, and what they answer when
Dex or the session refuses.

Every API view requires an authenticated user (token or session) and only ever sees the
caller's own sessions (staff: every session, which they read and whose approvals they decide);
another user's session answers 404 like an unknown one, and a write by staff to someone else's
session 403 (``SessionOwnedMixin``). Dex errors map to 503 ``{"detail", "unavailable"}``
naming the part that is down (``"engine"`` or ``"worker"``), to 404 (the engine has no such
session), or to 409 ``SessionStopped`` when the session's Flow no longer runs
(``DexErrorsMixin``, which the approvals API uses too).

May import: of ``agents_app.api`` only ``schema``; the domain (``selectors``, ``services``)
and everything below it.
"""

from rest_framework import status
from rest_framework.exceptions import APIException, NotFound, PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from agents_app.api.schema import CONFLICT, error_response
from agents_app.gateway import dex_gateway
from agents_app.models import AgentSession
from agents_app.rest_errors import ServiceUnavailable, unavailable_detail
from agents_app.selectors import platform_health, session_reads
from agents_app.services import session_lifecycle


class SessionTooLarge(ServiceUnavailable):
    """503: the engine cannot load this session's state in one piece."""

    default_code = "session_too_large"

    def __init__(self) -> None:
        super().__init__(
            "engine",
            "This session's stored conversation is too large for the engine to load at once "
            "(more than 4 MiB); start a new session.",
        )


class DexErrorsMixin:
    """Translate ``dex_gateway`` errors raised by a view into API errors: 503
    ``{"detail", "unavailable"}`` naming the part that is down; for a session Dex refused as
    not running, 409 ``SessionStopped`` when its Flow no longer runs (the index is marked
    stopped, ``session_lifecycle.session_stopped_detect``), else 404.

    ``engine_methods`` names the HTTP methods that call Dex, so can answer 503; the schema
    (``agents_app.api.schema.ApiAutoSchema``) documents 503 for exactly those.
    """

    engine_methods: frozenset[str] = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, dex_gateway.SessionNotFoundError) and self._flow_closed():
            exc = SessionStopped()
        if isinstance(exc, dex_gateway.SessionTooLargeError):
            exc = SessionTooLarge()
        elif isinstance(exc, dex_gateway.EngineUnavailableError):
            part = platform_health.unavailable_part(error=exc)
            detail = str(exc)
            if part == "worker" and exc.cause == "timeout":
                detail = unavailable_detail("worker")
            exc = ServiceUnavailable(part, detail)
        elif isinstance(exc, dex_gateway.SessionNotFoundError):
            exc = NotFound("The engine has no record of this session.")
        return super().handle_exception(exc)  # type: ignore[misc]

    def _flow_closed(self) -> bool:
        """Whether the URL's session is indexed and its Flow no longer runs in Dex."""
        session_id = getattr(self, "kwargs", {}).get("session_id")
        session = AgentSession.objects.filter(pk=session_id).first() if session_id else None
        if session is None:
            return False
        try:
            return session_lifecycle.session_stopped_detect(session=session)
        except (dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError):
            return False


SESSION_STOPPED_CONFLICT = error_response(
    409, CONFLICT, "The session is stopped; nothing changed."
)


SESSION_STOPPED_DETAIL = "This session is stopped; start a new one."


class SessionStopped(APIException):
    """409: the session is stopped, so nothing can be sent to it or change its queue."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = SESSION_STOPPED_DETAIL
    default_code = "session_stopped"


class SubagentSessionInput(APIException):
    """409: the session is a subagent's child (issue 29): it answers its parent's task in one
    turn and then completes, so a message sent to it would never be read."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = (
        "This is a subagent's session: it answers its parent's task and takes no messages. "
        "Send the parent session a message instead."
    )
    default_code = "subagent_session"


OWNER_ONLY_DETAIL = (
    "Only the session's owner may write to it (messages, its queue, answers, plan "
    "execution); staff may read it, stop it and decide its approvals."
)


class SessionOwnedMixin(DexErrorsMixin):
    """Look up the session from the URL: the owner's, or any for staff (who read every session
    they may approve); 404 for unknown or foreign IDs, so foreign IDs are not revealed."""

    def session_get(self, request: Request, session_id: str) -> AgentSession:
        try:
            return session_reads.session_get_for_owner_or_staff(
                user=request.user, session_id=session_id
            )
        except AgentSession.DoesNotExist:
            raise NotFound("No such session.") from None

    def session_get_for_owner(self, request: Request, session_id: str) -> AgentSession:
        """``session_get``, then 403 for staff reading someone else's session: only its owner
        writes to it."""
        session = self.session_get(request, session_id)
        if session.owner_id != request.user.pk:
            raise PermissionDenied(OWNER_ONLY_DETAIL)
        return session
