"""The speed-ups around the SDK's codec and pull Worker keep their answers (issue 13)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import pkgutil

import dex_agents
from dex_agents._records import AgentMessage, MessageRole
from dex_agents._worker_tuning import cache_sdk_version


def _package_dataclasses() -> list[type]:
    found = []
    for module_info in pkgutil.iter_modules(dex_agents.__path__):
        module = importlib.import_module(f"dex_agents.{module_info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and dataclasses.is_dataclass(value)
                and value.__module__ == module.__name__
            ):
                found.append(value)
    return found


def test_every_dataclass_of_the_package_has_evaluated_annotations() -> None:
    classes = _package_dataclasses()
    assert AgentMessage in classes
    unresolved = {
        cls.__qualname__: name
        for cls in classes
        for name, annotation in inspect.get_annotations(cls).items()
        if isinstance(annotation, str)
    }
    assert unresolved == {}


def test_a_record_round_trips_through_the_sdk_codec() -> None:
    from dex.codec import CodecRegistry

    codec = CodecRegistry().resolve(AgentMessage)
    message = AgentMessage(3, MessageRole.TOOL, "lookup ok", {"tool_call_id": "call-1"}, "turn-2")
    assert codec.decode(codec.encode(message)) == message


def test_the_sdk_version_is_read_once_and_stays_right() -> None:
    from dex import _pull_worker

    cache_sdk_version()
    cache_sdk_version()  # a second call keeps the one cache
    expected = importlib.metadata.version("dex-python-sdk")
    assert _pull_worker.sdk_version() == expected
    assert _pull_worker.sdk_version() == expected
    info = _pull_worker.sdk_version.cache_info()  # type: ignore[attr-defined]
    assert info.misses == 1
    assert info.hits >= 1
