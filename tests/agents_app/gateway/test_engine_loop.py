"""Where the gateway's calls run, and their deadlines (``agents_app.gateway.engine_loop``; no
engine needed)."""

from typing import Any

import pytest

from agents_app.gateway import engine_loop
from agents_app.gateway.engine_errors import EngineUnavailableError


def test_run_turns_a_missed_deadline_into_engine_unavailable() -> None:
    import asyncio

    async def slow() -> None:
        await asyncio.sleep(5)

    with pytest.raises(EngineUnavailableError, match="did not answer"):
        engine_loop.run(slow(), timeout=0.1)


async def test_call_runs_on_the_gateway_loop_not_the_callers() -> None:
    import asyncio

    async def where() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    ran_on = await engine_loop.call(where())
    assert ran_on is engine_loop._gateway_loop.get()
    assert ran_on is not asyncio.get_running_loop()


async def test_call_turns_a_missed_deadline_into_engine_unavailable_and_cancels(
    settings: Any,
) -> None:
    import asyncio
    import threading

    settings.DEXAGENTS = {**settings.DEXAGENTS, "ENGINE_TIMEOUT": 1}
    cancelled = threading.Event()

    async def never_answers() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(EngineUnavailableError) as raised:
        await engine_loop.call(never_answers())
    assert raised.value.cause == "timeout"
    # The call is cancelled where it ran, on the gateway loop.
    assert await asyncio.to_thread(cancelled.wait, 10)


async def test_call_passes_a_timeout_error_of_the_coroutine_through() -> None:
    async def times_out_itself() -> None:
        raise TimeoutError("own deadline")

    with pytest.raises(TimeoutError, match="own deadline"):
        await engine_loop.call(times_out_itself())
