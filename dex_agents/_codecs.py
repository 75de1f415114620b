"""Compiled JSON codecs: the SDK's automatic dataclass codec, built once per type.

dex-python-sdk 1.23.0 encodes a dataclass, an enum or a typed container as canonical JSON
(``dex.codec.JsonCodec``, section "Values" of the SDK). Its ``CodecRegistry.resolve`` builds a
new codec on every call, and every decode calls ``typing.get_type_hints`` and walks the type
hint again; for an agent turn that is about a fifth of the Dex worker's CPU.
:class:`AgentCodecRegistry` resolves each type hint once and compiles its encoder and decoder.

The output is the SDK's, byte for byte: the same JSON text for every value the SDK encodes
(sorted keys, compact separators, ``allow_nan=False``) and the same values or errors when
decoding, so a Dex state written by one codec is read by the other
(``tests/dex_agents/test_codecs.py`` compares them). The SDK's quirks are kept: a ``X | None``
or ``Any`` field decodes to its plain JSON value, a required dataclass field missing from the
JSON raises ``KeyError``. Two differences:

- A field with a default that is missing from the JSON takes its default, where the SDK raises
  ``KeyError``. This is how the package adds a field to a stored record (platform addition):
  a record written before the field existed, such as an ``AgentToolCall`` or a ``ToolPolicy``
  without ``timeout_seconds`` and ``retries``, still decodes, in a running session's state or
  on a Worker that reads what an older one wrote. Every reader of agent state must therefore
  use this registry (the platform's worker and web client and ``dex_agents.testing`` do).
- The SDK copies a value with ``dataclasses.asdict`` before encoding, which fails on some
  objects in an ``Any`` field (a ``Counter``, a ``defaultdict``, a ``MappingProxyType``); this
  codec encodes them as the JSON objects they hold.

A hint this module cannot compile (a bare ``typing.List``, an undefined forward reference) is
left to the SDK's codec.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields, is_dataclass
from datetime import datetime
from enum import Enum
from typing import Any, get_args, get_origin, get_type_hints

from dex.codec import Codec, CodecRegistry, JsonCodec, Value, WireKind

from dex_agents._wire_types import resolve_annotations

__all__ = ["AgentCodecRegistry"]

_Decoder = Callable[[Any], Any]
_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None)})
#: Field names of each type the encoder met, in definition order; ``None`` for a type that
#: is not a dataclass.
_DATACLASS_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _dataclass_fields(kind: type) -> tuple[str, ...] | None:
    try:
        return _DATACLASS_FIELDS[kind]
    except KeyError:
        names = tuple(field.name for field in fields(kind)) if is_dataclass(kind) else None
        _DATACLASS_FIELDS[kind] = names
        return names


def _to_json(value: Any) -> Any:
    """JSON-compatible data for ``value``, as ``asdict`` then the SDK's encoder make it."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    names = _dataclass_fields(kind)
    if names is not None:
        return {name: _to_json(getattr(value, name)) for name in names}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {key: _to_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(item) for item in value]
    return value


def _compile(hint: object) -> _Decoder:
    """The decoder of JSON data for ``hint``, as ``dex.codec._decode_json_value`` decodes."""
    if isinstance(hint, type) and is_dataclass(hint):
        return _COMPILED.get(hint) or _compile_dataclass(hint)
    if hint is datetime:
        return _decode_datetime
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint
    origin = get_origin(hint)
    arguments = get_args(hint)
    if origin is list:
        item = _compile(arguments[0])
        return lambda value: [item(entry) for entry in value]
    if origin is tuple:
        item = _compile(arguments[0])
        return lambda value: tuple(item(entry) for entry in value)
    if origin is dict:  # see _automatic_json on Mapping[...]
        key, item = _compile(arguments[0]), _compile(arguments[1])
        return lambda value: {key(k): item(v) for k, v in value.items()}
    if hint in (str, bool, int, float):
        return _exact(hint)  # type: ignore[arg-type]
    return _identity


def _compile_dataclass(kind: type) -> _Decoder:
    # (name, decoder, required): a field with a default may be missing from the JSON.
    decoders: list[tuple[str, _Decoder, bool]] = []

    def decode(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise TypeError(f"{kind.__qualname__} requires a JSON object")
        return kind(
            **{
                name: field_decoder(value[name])
                for name, field_decoder, required in decoders
                if required or name in value
            }
        )

    # Filled after ``decode`` exists, so a dataclass that refers to itself compiles.
    _COMPILED[kind] = decode
    hints = get_type_hints(kind)
    decoders.extend(
        (
            field.name,
            _compile(hints[field.name]),
            field.default is MISSING and field.default_factory is MISSING,
        )
        for field in fields(kind)
    )
    return decode


#: Decoders compiled so far, by dataclass.
_COMPILED: dict[type, _Decoder] = {}


def _decode_datetime(value: Any) -> datetime:
    if not isinstance(value, str):
        raise TypeError("datetime requires a JSON string")
    return datetime.fromisoformat(value)


def _exact(kind: type) -> _Decoder:
    def decode(value: Any) -> Any:
        if type(value) is not kind:
            raise TypeError(f"expected {kind.__qualname__}")
        return value

    return decode


def _identity(value: Any) -> Any:
    return value


def _type_check(hint: object) -> Callable[[object], bool]:
    """The SDK's ``expected_type`` check for ``hint`` (``dex.codec._matches_type``)."""
    origin = get_origin(hint)
    arguments = get_args(hint)
    if origin in (list, tuple):
        item = _type_check(arguments[0])
        return lambda value: isinstance(value, origin) and all(item(entry) for entry in value)
    if origin is dict:
        key, item = _type_check(arguments[0]), _type_check(arguments[1])
        return lambda value: (
            isinstance(value, Mapping) and all(key(k) and item(v) for k, v in value.items())
        )
    if isinstance(hint, type):
        return lambda value: type(value) is hint
    return lambda value: False


class _CompiledJsonCodec(JsonCodec[Any]):
    """A ``JsonCodec`` whose check, encoder and decoder were compiled for one type hint."""

    _matches: Callable[[object], bool]

    def __init__(self, hint: object) -> None:
        super().__init__(getattr(hint, "__qualname__", str(hint)), _compile(hint), _to_json, hint)
        # JsonCodec is a frozen dataclass.
        object.__setattr__(self, "_matches", _type_check(hint))

    def encode(self, value: Any) -> Value:
        if not self._matches(value):
            expected = getattr(self.expected_type, "__qualname__", str(self.expected_type))
            raise TypeError(f"{self.type_name} requires {expected}, got {type(value).__name__}")
        text = json.dumps(_to_json(value), allow_nan=False, separators=(",", ":"), sort_keys=True)
        return Value(WireKind.JSON, text)


def _compiled_or_none(hint: object) -> _CompiledJsonCodec | None:
    """The compiled codec of ``hint``, or ``None`` where compiling fails (a bare
    ``typing.List``, a forward reference not defined yet, ...): the SDK's own codec then
    decides, at encode or decode time as it does. A failed compile leaves no decoder behind."""
    before = set(_COMPILED)
    try:
        return _CompiledJsonCodec(hint)
    except Exception:
        for kind in set(_COMPILED) - before:
            del _COMPILED[kind]
        return None


def _automatic_json(hint: object) -> bool:
    """Whether the SDK would derive a ``JsonCodec`` for ``hint`` (``_supports_automatic_json``).

    The SDK also compares the origin with ``typing.Mapping`` and ``typing.Sequence``, which no
    origin equals (``get_origin`` gives ``collections.abc`` classes): a ``Mapping[...]`` or
    ``Sequence[...]`` hint gets no automatic codec, and a field so typed decodes to plain JSON.
    """
    return (
        isinstance(hint, type) and (is_dataclass(hint) or issubclass(hint, Enum))
    ) or get_origin(hint) in (list, tuple, dict)


class AgentCodecRegistry(CodecRegistry):
    """A ``dex.codec.CodecRegistry`` that resolves each type hint once.

    Pass it as ``Registry(flows, AgentCodecRegistry(), allow_async_handlers=True)``. Codecs
    given in ``codecs`` win, as in the SDK; the SDK's built-in codecs (``str``, ``int``,
    ``datetime``, ...) are returned as they are; a dataclass, enum or typed ``list`` /
    ``tuple`` / ``dict`` gets a compiled JSON codec with the SDK's output; any other hint is
    left to the SDK.

    Raises:
        TypeError: From ``resolve``, if no codec can represent the hint (as the SDK).
    """

    def __init__(self, codecs: Mapping[object, Codec[Any]] | None = None) -> None:
        super().__init__(codecs)
        self._resolved: dict[object, Codec[Any]] = {}

    def resolve(self, type_hint: object) -> Codec[Any]:
        try:
            return self._resolved[type_hint]
        except KeyError:
            pass
        except TypeError:  # an unhashable hint: the SDK decides
            return super().resolve(type_hint)
        compiled = None
        if type_hint not in self._codecs and _automatic_json(type_hint):
            compiled = _compiled_or_none(type_hint)
        codec: Codec[Any] = compiled if compiled is not None else super().resolve(type_hint)
        self._resolved[type_hint] = codec
        return codec


resolve_annotations(globals())
