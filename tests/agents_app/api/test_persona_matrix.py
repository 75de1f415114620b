"""The persona matrix: every route under ``/api/`` and every websocket route, for every method
it serves, answers each persona (anonymous, wrong token, another user, owner, staff) with the
status this table expects.

The routes come from Django's URL resolver and ``agents_app.live.routing``, not from a list kept
by hand: a new endpoint, or a new method on one, fails ``test_every_route_has_a_row`` until it
gets a row here, so nobody can add one without deciding who may call it.

No engine runs (``engine_down``: a refused connection). A caller that passes every permission
check on an endpoint that asks Dex therefore gets 503 (``ENGINE``), which is what shows that
the check let them through; refusals (401, 403, 404) and body validation (400) are decided
before any Dex call. Writes send an empty body, so an allowed caller gets 400 and nothing
changes. The owner's and staff's successful reads against a real engine and worker are in
``tests/e2e/test_approvals.py``.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient
from rest_framework.views import APIView

from agents_app.live.routing import websocket_urlpatterns
from agents_app.models import AgentDefinition, AgentSession, AgentTrigger, Schedule
from agents_app.services.api_tokens import api_token_create
from tests.conftest import api_token_key
from tests.factories import AgentDefinitionFactory

PERSONAS = ("anonymous", "wrong token", "other user", "owner", "staff")
#: The engine is down in these tests: 503 means the caller passed every check and reached Dex.
ENGINE = 503
WRONG_KEY = "dxa_" + "0" * 64
SESSION_ID = "ses_" + "c" * 32
#: Methods a route may serve; the ones it does not serve must answer 405.
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")

#: ``(route, method)``: the status for (anonymous, wrong token, other user, owner, staff).
#: Session routes act on the owner's session; ``token_id`` is one of the owner's tokens.
MATRIX: dict[tuple[str, str], tuple[int, int, int, int, int]] = {
    ("api/schema/", "GET"): (401, 401, 200, 200, 200),
    # Swagger UI and Redoc are pages for a logged-in browser: token clients go to the login.
    ("api/docs/", "GET"): (302, 302, 302, 302, 302),
    ("api/redoc/", "GET"): (302, 302, 302, 302, 302),
    ("api/redoc/redoc.standalone.js", "GET"): (302, 302, 302, 302, 302),
    ("api/v1/agents/", "GET"): (401, 401, 200, 200, 200),
    # An inbound trigger's signature is its authentication: tokens change nothing, and an
    # unsigned delivery is 401 for everyone (tests/agents_app/api/test_triggers.py).
    ("api/v1/agents/<slug:slug>/triggers/<slug:name>/", "POST"): (401, 401, 401, 401, 401),
    # Everyone reads their own usage figures (another user's calls are never in them).
    ("api/v1/usage/", "GET"): (401, 401, 200, 200, 200),
    # Staff choose their own approval emails (only staff decide approvals).
    ("api/v1/me/notifications/", "GET"): (401, 401, 403, 403, 200),
    ("api/v1/me/notifications/", "PUT"): (401, 401, 403, 403, 400),
    ("api/v1/tokens/", "GET"): (401, 401, 200, 200, 200),
    # Schedules are their owner's (issue 29); staff manage everyone's in Django admin. An
    # empty body is a 400; an empty PATCH changes nothing but the generation.
    ("api/v1/schedules/", "GET"): (401, 401, 200, 200, 200),
    ("api/v1/schedules/", "POST"): (401, 401, 400, 400, 400),
    ("api/v1/schedules/preview/", "POST"): (401, 401, 400, 400, 400),
    ("api/v1/schedules/<int:schedule_id>/", "GET"): (401, 401, 404, 200, 404),
    ("api/v1/schedules/<int:schedule_id>/", "PUT"): (401, 401, 404, 400, 404),
    ("api/v1/schedules/<int:schedule_id>/", "PATCH"): (401, 401, 404, 200, 404),
    ("api/v1/schedules/<int:schedule_id>/", "DELETE"): (401, 401, 404, 204, 404),
    ("api/v1/schedules/<int:schedule_id>/runs/", "GET"): (401, 401, 404, 200, 404),
    # Clients here hold tokens, and a token may not create tokens (password or session only).
    ("api/v1/tokens/", "POST"): (401, 401, 403, 403, 403),
    ("api/v1/tokens/<int:token_id>/", "DELETE"): (401, 401, 404, 204, 404),
    ("api/v1/approvals/", "GET"): (401, 401, 403, 403, 200),
    ("api/v1/approvals/decisions/", "GET"): (401, 401, 403, 403, 200),
    ("api/v1/approvals/bulk/", "POST"): (401, 401, 403, 403, 400),
    ("api/v1/sessions/", "GET"): (401, 401, 200, 200, 200),
    ("api/v1/sessions/", "POST"): (401, 401, 400, 400, 400),
    # Staff read every session; only its owner writes to it (staff: 403, others: 404).
    ("api/v1/sessions/<str:session_id>/", "GET"): (401, 401, 404, ENGINE, ENGINE),
    ("api/v1/sessions/<str:session_id>/messages/", "GET"): (401, 401, 404, ENGINE, ENGINE),
    ("api/v1/sessions/<str:session_id>/messages/<int:sequence>/text/", "GET"): (
        401, 401, 404, ENGINE, ENGINE
    ),
    ("api/v1/sessions/<str:session_id>/messages/", "POST"): (401, 401, 404, 400, 403),
    # Without the engine the queue still lists the outbox's undelivered messages ("partial").
    ("api/v1/sessions/<str:session_id>/queue/", "GET"): (401, 401, 404, 200, 200),
    ("api/v1/sessions/<str:session_id>/queue/<str:message_id>/", "PUT"): (
        401, 401, 404, 400, 403,
    ),
    ("api/v1/sessions/<str:session_id>/queue/<str:message_id>/", "DELETE"): (
        401, 401, 404, ENGINE, 403,
    ),
    ("api/v1/sessions/<str:session_id>/queue/<str:message_id>/steer/", "POST"): (
        401, 401, 404, ENGINE, 403,
    ),
    ("api/v1/sessions/<str:session_id>/input/", "POST"): (401, 401, 404, 400, 403),
    # Only the owner answers an MCP server's question (staff may read it, not answer).
    ("api/v1/sessions/<str:session_id>/elicitations/<str:elicitation_id>/", "POST"): (
        401, 401, 404, 400, 403,
    ),
    ("api/v1/sessions/<str:session_id>/plan/execute/", "POST"): (401, 401, 404, 400, 403),
    ("api/v1/sessions/<str:session_id>/history/", "GET"): (401, 401, 404, ENGINE, ENGINE),
    # Server-Sent Events open without the engine: the stream waits for it (not read here).
    ("api/v1/sessions/<str:session_id>/events/", "GET"): (401, 401, 404, 200, 200),
    # Owner or staff may stop a session.
    ("api/v1/sessions/<str:session_id>/stop/", "POST"): (401, 401, 404, ENGINE, ENGINE),
    # Only the owner renames or archives (an empty PATCH body is a 400); owner or staff delete.
    ("api/v1/sessions/<str:session_id>/", "PATCH"): (401, 401, 404, 400, 403),
    ("api/v1/sessions/<str:session_id>/", "DELETE"): (401, 401, 404, ENGINE, ENGINE),
    ("api/v1/sessions/<str:session_id>/archive/", "POST"): (401, 401, 404, 200, 403),
    ("api/v1/sessions/<str:session_id>/unarchive/", "POST"): (401, 401, 404, 200, 403),
    # Only the owner cancels the running turn (staff may stop the session, not cancel a turn).
    ("api/v1/sessions/<str:session_id>/turn/cancel/", "POST"): (401, 401, 404, ENGINE, 403),
    # Only staff decide approvals, on any session.
    ("api/v1/sessions/<str:session_id>/interrupts/<str:interrupt_id>/", "POST"): (
        401, 401, 403, 403, 400,
    ),
}

OPEN = "open"
#: Websocket routes (``agents_app.live.routing``): the close code each persona gets right after
#: the handshake, or ``OPEN`` when the socket stays open.
WS_MATRIX: dict[str, tuple[int | str, int | str, int | str, int | str, int | str]] = {
    "ws/sessions/<str:session_id>/events/": (4401, 4401, 4404, OPEN, OPEN),
    "ws/approvals/": (4401, 4401, 4403, 4403, OPEN),
    # The catch-all: every other path.
    "": (4404, 4404, 4404, 4404, 4404),
}
#: What the catch-all route is tried with.
WS_UNKNOWN_PATH = "ws/no-such-route/"


def api_routes(urlconf: Any = None) -> dict[str, Any]:
    """``{route: view callback}`` of every URL pattern under ``api/`` in ``urlconf`` (default:
    the project's), route as written in the URL conf (prefixes joined)."""

    def walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, Any]]:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern):
                yield route, pattern.callback

    return {
        route: callback
        for route, callback in walk(get_resolver(urlconf).url_patterns, "")
        if route.startswith("api/")
    }


def served_methods(callback: Any) -> list[str] | None:
    """The methods a DRF view serves (OPTIONS aside), or None for other views."""
    view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    if view_class is None or not issubclass(view_class, APIView):
        return None
    return [method for method in METHODS if hasattr(view_class, method.lower())]


def matrix_gaps(urlconf: Any = None) -> tuple[list[str], list[str]]:
    """``(routes or methods without a MATRIX row, MATRIX rows without an endpoint)``."""
    routes = api_routes(urlconf)
    missing = []
    for route, callback in routes.items():
        methods = served_methods(callback)
        if methods is None:
            methods = [method for (row_route, method) in MATRIX if row_route == route]
            if not methods:
                missing.append(f"{route} (not a DRF view: give its methods rows)")
        missing += [f"{method} {route}" for method in methods if (route, method) not in MATRIX]
    stale = []
    for route, method in MATRIX:
        served = served_methods(routes[route]) if route in routes else []
        if route not in routes or (served is not None and method not in served):
            stale.append(f"{method} {route}")
    return missing, stale


def test_every_route_has_a_row() -> None:
    """Fails for an endpoint or method without a row, and for a row without an endpoint."""
    missing, stale = matrix_gaps()
    assert not missing, "add these to MATRIX (who may call them?): " + ", ".join(missing)
    assert not stale, "MATRIX rows without an endpoint: " + ", ".join(stale)
    ws_routes = [str(pattern.pattern) for pattern in websocket_urlpatterns]
    assert sorted(ws_routes) == sorted(WS_MATRIX), "add websocket routes to WS_MATRIX"


def test_a_new_endpoint_without_a_row_is_caught() -> None:
    """The check above can fail: a URL conf with one more API view, and a plain Django view,
    under ``/api/``."""
    from django.http import HttpResponse
    from django.urls import include, path

    import dexagents_site.urls

    class NewApi(APIView):
        def get(self, request: Any) -> Any:
            return HttpResponse()

        def delete(self, request: Any) -> Any:
            return HttpResponse()

    urlconf = types.ModuleType("urlconf_with_new_routes")
    urlconf.urlpatterns = [  # type: ignore[attr-defined]
        *dexagents_site.urls.urlpatterns,
        path("api/v2/", include([path("things/<int:thing_id>/", NewApi.as_view())])),
        path("api/plain/", lambda request: HttpResponse()),
    ]
    missing, stale = matrix_gaps(urlconf)
    assert missing == [
        "GET api/v2/things/<int:thing_id>/",
        "DELETE api/v2/things/<int:thing_id>/",
        "api/plain/ (not a DRF view: give its methods rows)",
    ]
    assert stale == []


@pytest.fixture
def world(
    owner: Any, other_user: Any, staff: Any, engine_down: str
) -> dict[str, Any]:
    """The owner's session (index row only), and one API client per persona."""
    agent = AgentDefinitionFactory.create(slug="demo")
    AgentSession.objects.create(id=SESSION_ID, owner=owner, agent=agent)
    AgentTrigger.objects.create(
        agent=agent, name="persona-trigger", message_template="{{ body }}", run_as=owner,
        secret="trsec_persona",
    )
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION=f"Bearer {WRONG_KEY}")
    clients = {"anonymous": APIClient(), "wrong token": wrong}
    for name, user in (("other user", other_user), ("owner", owner), ("staff", staff)):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token_key(user)}")
        clients[name] = client
    return {"owner": owner, "clients": clients}


def path_values(owner: Any) -> dict[str, Callable[[], str]]:
    """A value for every path parameter, made fresh for each request (a DELETE may use up
    the one before)."""
    return {
        "session_id": lambda: SESSION_ID,
        "message_id": lambda: "0190f5c2-7a1b-7c3d-8e4f-000000000001",
        "interrupt_id": lambda: "turn_1.call_1",
        "elicitation_id": lambda: "turn-1.call_1.0123456789abcdef",
        "token_id": lambda: str(api_token_create(user=owner, name="target")[0].pk),
        "sequence": lambda: "1",
        "slug": lambda: "demo",
        "name": lambda: "persona-trigger",
        "schedule_id": lambda: str(Schedule.objects.create(
            owner=owner, agent=AgentDefinition.objects.get(slug="demo"), name="s",
            message="m", interval_seconds=60, enabled=False,
        ).pk),
    }


def fill(route: str, values: dict[str, Callable[[], str]]) -> str:
    """``route`` with every ``<converter:name>`` replaced by ``values[name]()``."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in values, f"no value for path parameter {name!r}: add it to path_values"
        return values[name]()

    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", value, route)


def test_every_persona_gets_the_expected_status(world: dict[str, Any]) -> None:
    values = path_values(world["owner"])
    routes = api_routes()
    wrong: list[str] = []
    for (route, method), expected in MATRIX.items():
        for persona, status in zip(PERSONAS, expected, strict=True):
            client = world["clients"][persona]
            response = client.generic(method, fill(route, values), "{}", "application/json")
            if response.status_code != status:
                wrong.append(
                    f"{method} {route} as {persona}: {response.status_code}, expected {status} "
                    f"({response.content[:200]!r})"
                )
        # Methods the route does not serve: 405 (for staff, whom every view's class-level
        # permission lets through; DRF checks those before the method).
        served = served_methods(routes[route])
        if served is None:  # a plain Django view: the methods its rows name
            served = [row_method for (row_route, row_method) in MATRIX if row_route == route]
        for method in METHODS:
            if method in served:
                continue
            answer = world["clients"]["staff"].generic(
                method, fill(route, values), "{}", "application/json"
            )
            if answer.status_code != 405:
                wrong.append(f"{method} {route} as staff: {answer.status_code}, expected 405")
    assert not wrong, "\n".join(wrong)


def test_staff_writes_to_someone_elses_session_say_why(world: dict[str, Any]) -> None:
    """Every owner-only route answers staff 403 with the same explanation."""
    from agents_app.api.session_access import OWNER_ONLY_DETAIL

    values = path_values(world["owner"])
    owner_only = [row for row, expected in MATRIX.items() if expected[3:] == (400, 403)
                  or (expected[3] in (ENGINE, 200) and expected[4] == 403)]
    assert len(owner_only) == 11
    for route, method in owner_only:
        response = world["clients"]["staff"].generic(
            method, fill(route, values), "{}", "application/json"
        )
        assert response.status_code == 403
        assert response.json() == {"detail": OWNER_ONLY_DETAIL}, (route, method)


@pytest.mark.django_db(transaction=True)
async def test_every_persona_gets_the_expected_websocket_close_code(
    owner: Any, other_user: Any, staff: Any, engine_down: str
) -> None:
    from asgiref.sync import sync_to_async

    from dexagents_site.asgi import application

    def setup() -> dict[str, list[tuple[bytes, bytes]]]:
        AgentSession.objects.create(
            id=SESSION_ID, owner=owner, agent=AgentDefinitionFactory.create(slug="demo")
        )
        headers = {"anonymous": [], "wrong token": [(b"authorization", f"Bearer {WRONG_KEY}")]}
        for name, user in (("other user", other_user), ("owner", owner), ("staff", staff)):
            headers[name] = [(b"authorization", f"Bearer {api_token_key(user)}")]
        return {
            name: [(header, value if isinstance(value, bytes) else value.encode())
                   for header, value in pairs]
            for name, pairs in headers.items()
        }

    headers = await sync_to_async(setup)()

    async def outcome(path: str, persona: str) -> int | str:
        communicator = WebsocketCommunicator(application, path, headers=headers[persona])
        connected, _ = await communicator.connect(timeout=5)
        assert connected, f"{path} as {persona}: the handshake failed"
        # receive_nothing, unlike a receive_output that times out, leaves the consumer running.
        if await communicator.receive_nothing(timeout=1):
            message = {"type": "websocket.send"}  # silent and open
        else:
            message = await communicator.receive_output(timeout=1)
        if message["type"] == "websocket.close":
            # Answer the close as a browser does (the server then sends websocket.disconnect):
            # the consumer stops at once; ``wait()`` alone would sit out its 1 s timeout.
            await communicator.disconnect(code=int(message["code"]))
            return int(message["code"])
        await communicator.disconnect()
        return OPEN

    wrong = []
    for route, expected in WS_MATRIX.items():
        path = "/" + (route.replace("<str:session_id>", SESSION_ID) or WS_UNKNOWN_PATH)
        for persona, code in zip(PERSONAS, expected, strict=True):
            got = await outcome(path, persona)
            if got != code:
                wrong.append(f"{path} as {persona}: {got}, expected {code}")
    assert not wrong, "\n".join(wrong)
