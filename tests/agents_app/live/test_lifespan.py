"""The web process's ASGI lifespan warms the URLconf and the engine connection at start-up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from agents_app.gateway import engine_connection, engine_loop
from agents_app.live.lifespan import WebWarmUp, web_warm
from agents_app.models import OutboxMessage
from tests.factories import AgentDefinitionFactory, AgentSessionFactory


async def _lifespan(app: WebWarmUp) -> list[dict[str, Any]]:
    """Drive ``app`` through start-up and shut-down as uvicorn does; return what it sent."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for message_type in ("lifespan.startup", "lifespan.shutdown"):
        inbox.put_nowait({"type": message_type})
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await asyncio.wait_for(app({"type": "lifespan"}, inbox.get, send), 30)
    return sent


async def test_start_up_connects_to_the_engine_before_it_completes(engine: str) -> None:
    sent = await _lifespan(WebWarmUp())

    assert sent == [{"type": "lifespan.startup.complete"},
                    {"type": "lifespan.shutdown.complete"}]
    # The gateway's connection to this engine exists before any request made it.
    connections = engine_connection._connections.get(engine_loop._gateway_loop.get(), {})
    assert engine in connections


async def test_start_up_completes_when_the_engine_is_down(engine_down: str) -> None:
    assert await web_warm(engine_timeout=5) is False
    assert await _lifespan(WebWarmUp()) == [{"type": "lifespan.startup.complete"},
                                            {"type": "lifespan.shutdown.complete"}]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("eager_celery")
async def test_start_up_sweeps_the_outbox_a_killed_process_left(
    engine_down: str, owner: Any
) -> None:
    # A message kept by a web process that was killed before it delivered or queued it.
    def keep() -> OutboxMessage:
        session = AgentSessionFactory.create(
            owner=owner, agent=AgentDefinitionFactory.create(slug="demo"),
            status="waiting_for_user_message",
        )
        return OutboxMessage.objects.create(id="k" * 32, session=session, text="kept")

    message = await sync_to_async(keep)()

    await _lifespan(WebWarmUp())

    # The start-up sweep tried it at once (the engine is down here, so it stays pending).
    await message.arefresh_from_db()
    assert (message.delivery, message.attempts) == ("pending", 1)
    assert engine_down in message.last_error


async def test_other_scopes_are_refused() -> None:
    async def receive() -> Any:
        raise AssertionError("not read")

    async def send(message: Any) -> None:
        raise AssertionError("not sent")

    with pytest.raises(ValueError, match="lifespan"):
        await WebWarmUp()({"type": "http"}, receive, send)
