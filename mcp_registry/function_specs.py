"""How MCP tools are offered to models as OpenAI-style functions: names and parameter schemas.

Names: a tool is offered as ``<server>__<tool>``. OpenAI function names must match
``^[a-zA-Z0-9_-]{1,64}$`` (OpenAI API reference, "Chat/Create/tools/function/name"), while MCP
allows any string as a tool name (MCP specification, "Tools/Tool"), so every other character
becomes ``_``. A name longer than 64 characters, or one that two tools would share, becomes its
first 55 characters, ``_`` and the first 8 hex digits of SHA-256 of ``<server>/<tool>`` (the raw
names). Among tools that share a name, the first by (server name, tool name) keeps the plain
name, so the outcome depends only on the set of tools, never on discovery order.

Schemas: an MCP ``inputSchema`` is a JSON Schema object (MCP specification, "Tools/Tool",
``inputSchema``); OpenAI-style function calling wants ``parameters`` to be an object schema with
``properties`` and no combinator at the top level. :func:`function_parameters_build` converts
what can be converted and raises :class:`ToolSchemaError` for the rest, which quarantines the
tool.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.validators import validator_for

EXPOSED_NAME_SEPARATOR = "__"
MAX_FUNCTION_NAME_LENGTH = 64
_HASHED_PREFIX_LENGTH = 55
_INVALID_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9_-]")
# OpenAI rejects these at the top level of ``parameters``.
_TOP_LEVEL_COMBINATORS = ("anyOf", "oneOf", "allOf", "not", "enum")
# Keys that describe the document rather than the arguments; some providers reject them.
_DOCUMENT_KEYS = ("$schema", "$id")
MAX_SCHEMA_CHARS = 100_000


class ToolSchemaError(ValueError):
    """An input schema cannot be offered as function parameters; ``str(error)`` says why."""


def exposed_name_hashed(*, server_name: str, tool_name: str) -> str:
    """The hashed form of a tool's exposed name (see the module docstring), 64 chars at most."""
    base = exposed_name_base(server_name=server_name, tool_name=tool_name)
    digest = hashlib.sha256(f"{server_name}/{tool_name}".encode()).hexdigest()[:8]
    return f"{base[:_HASHED_PREFIX_LENGTH]}_{digest}"


def exposed_name_base(*, server_name: str, tool_name: str) -> str:
    """``<server>__<tool>`` with every character OpenAI does not allow replaced by ``_``.

    May be longer than 64 characters; :func:`exposed_names_assign` shortens those.
    """
    raw = f"{server_name}{EXPOSED_NAME_SEPARATOR}{tool_name}"
    return _INVALID_NAME_CHARACTERS.sub("_", raw)


def exposed_name_build(*, server_name: str, tool_name: str) -> str:
    """The exposed name of a tool that collides with no other: the base name, or the hashed
    form when the base is longer than 64 characters."""
    base = exposed_name_base(server_name=server_name, tool_name=tool_name)
    if len(base) <= MAX_FUNCTION_NAME_LENGTH:
        return base
    return exposed_name_hashed(server_name=server_name, tool_name=tool_name)


def exposed_names_assign(tools: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Give every ``(server name, tool name)`` pair a distinct function name.

    Args:
        tools: The pairs, in any order; duplicates count once.

    Returns:
        ``{(server, tool): name}``; every name matches ``^[A-Za-z0-9_-]{1,64}$`` and no two are
        equal. Deterministic: the result depends only on the set of pairs.
    """
    pairs = sorted(set(tools))
    wanted: dict[str, list[tuple[str, str]]] = {}
    for server_name, tool_name in pairs:
        name = exposed_name_build(server_name=server_name, tool_name=tool_name)
        wanted.setdefault(name, []).append((server_name, tool_name))
    assigned: dict[tuple[str, str], str] = {}
    taken = set(wanted)
    for name, claimants in sorted(wanted.items()):
        assigned[claimants[0]] = name
        for server_name, tool_name in claimants[1:]:
            candidate = exposed_name_hashed(server_name=server_name, tool_name=tool_name)
            counter = 0
            # A clash of 8 hex digits is vanishingly rare; stay deterministic if one happens.
            while candidate in taken:
                counter += 1
                digest = hashlib.sha256(
                    f"{server_name}/{tool_name}/{counter}".encode()
                ).hexdigest()[:8]
                candidate = f"{candidate[:_HASHED_PREFIX_LENGTH]}_{digest}"
            taken.add(candidate)
            assigned[(server_name, tool_name)] = candidate
    return assigned


def _walk(node: Any, path: str = "#") -> Iterator[tuple[str, Mapping[str, Any]]]:
    if isinstance(node, Mapping):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}/{index}")


def _pointer_resolves(document: Any, pointer: str) -> bool:
    node = document
    for raw in pointer.lstrip("#").split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def function_parameters_build(input_schema: Any) -> dict[str, Any]:
    """Convert an MCP tool's ``inputSchema`` into OpenAI-style function ``parameters``.

    Conversion: ``$schema`` and ``$id`` are dropped, a missing ``type`` becomes ``"object"``
    and missing ``properties`` become ``{}``. Checks: the schema is a JSON object of type
    ``object`` with no ``anyOf``/``oneOf``/``allOf``/``not``/``enum`` at the top level,
    ``properties`` is an object and ``required`` a list of strings, the whole is a valid
    JSON Schema for the draft it names (2020-12 when it names none, the MCP default), every
    ``$ref`` points inside the schema and resolves, and it serialises to at most 100,000
    characters.

    Returns:
        A new dict; ``input_schema`` is not modified.

    Raises:
        ToolSchemaError: The schema cannot be made valid; the message says why.
    """
    if not isinstance(input_schema, Mapping):
        raise ToolSchemaError("the input schema is not a JSON object")
    try:
        serialised = json.dumps(input_schema)
    except (TypeError, ValueError) as error:
        raise ToolSchemaError(f"the input schema is not JSON: {error}") from error
    if len(serialised) > MAX_SCHEMA_CHARS:
        raise ToolSchemaError(
            f"the input schema has {len(serialised)} characters, more than {MAX_SCHEMA_CHARS}"
        )
    schema: dict[str, Any] = json.loads(serialised)
    validator = validator_for(schema, default=Draft202012Validator)
    try:
        validator.check_schema(schema)
    except SchemaError as error:
        where = "/".join(str(part) for part in error.path) or "the top level"
        raise ToolSchemaError(f"not a valid JSON Schema at {where}: {error.message}") from error
    for key in _DOCUMENT_KEYS:
        schema.pop(key, None)
    schema.setdefault("type", "object")
    if schema["type"] != "object":
        raise ToolSchemaError(f"the top-level type is {schema['type']!r}, not 'object'")
    combinators = [key for key in _TOP_LEVEL_COMBINATORS if key in schema]
    if combinators:
        raise ToolSchemaError(
            f"function parameters cannot have {', '.join(combinators)} at the top level"
        )
    properties = schema.setdefault("properties", {})
    if not isinstance(properties, Mapping):
        raise ToolSchemaError("'properties' is not an object")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise ToolSchemaError("'required' is not a list of property names")
    for path, node in _walk(schema):
        reference = node.get("$ref")
        if reference is None or not isinstance(reference, str):
            continue
        if not reference.startswith("#"):
            raise ToolSchemaError(f"$ref {reference!r} at {path} points outside the schema")
        if not _pointer_resolves(schema, reference):
            raise ToolSchemaError(f"$ref {reference!r} at {path} does not resolve")
    return schema
