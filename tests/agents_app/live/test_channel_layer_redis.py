"""The Redis channel layer, as settings configure it, keeps an idle consumer's read open."""

from __future__ import annotations

import subprocess
import sys

from tests.production_services import redis_url

__all__ = ["redis_url"]

# Longer than redis-py's default 5 s read timeout, which closed idle websockets.
_IDLE_SECONDS = 6.5

_PROBE = f"""
import asyncio, django
django.setup()
from channels.layers import get_channel_layer

async def main():
    layer = get_channel_layer()
    channel = await layer.new_channel()
    try:
        await asyncio.wait_for(layer.receive(channel), {_IDLE_SECONDS})
    except TimeoutError:
        print("idle read stayed open")
    await layer.send(channel, {{"type": "ping"}})
    print("received", (await layer.receive(channel))["type"])

asyncio.run(main())
"""


def test_an_idle_channel_read_outlives_redis_default_timeout(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={"REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "dexagents_site.settings",
             "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["idle read stayed open", "received ping"]
