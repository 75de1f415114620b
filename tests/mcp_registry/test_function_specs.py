"""Exposed function names and parameter schemas (mcp_registry.function_specs)."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from mcp_registry.function_specs import (
    ToolSchemaError,
    exposed_name_build,
    exposed_names_assign,
    function_parameters_build,
)

VALID_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@pytest.mark.parametrize(
    ("server", "tool", "expected"),
    [
        ("search", "web_search", "search__web_search"),
        ("everything", "get-sum", "everything__get-sum"),
        ("files", "read.file", "files__read_file"),
        ("files", "dir/list all", "files__dir_list_all"),
        ("files", "résumé", "files__r_sum_"),
    ],
)
def test_names_keep_valid_characters_and_replace_the_rest(
    server: str, tool: str, expected: str
) -> None:
    assert exposed_name_build(server_name=server, tool_name=tool) == expected


def test_long_names_are_cut_to_64_with_a_hash() -> None:
    long_tool = "a" * 80
    name = exposed_name_build(server_name="search", tool_name=long_tool)
    assert len(name) == 64 and VALID_NAME.match(name)
    assert name.startswith("search__aaaa")
    other = exposed_name_build(server_name="search", tool_name=long_tool + "b")
    assert other != name and len(other) == 64


def test_collisions_are_resolved_deterministically() -> None:
    pairs = [
        ("files", "read.file"),
        ("files", "read_file"),
        ("files", "read file"),
        ("files", "x" * 70),
        ("files", "x" * 71),
        ("other", "read_file"),
    ]
    first = exposed_names_assign(pairs)
    assert len(set(first.values())) == len(pairs)
    assert all(VALID_NAME.match(name) for name in first.values())
    # The first claimant by (server, tool) keeps the plain name.
    assert first[("files", "read file")] == "files__read_file"
    assert first[("other", "read_file")] == "other__read_file"
    for _ in range(5):
        shuffled = pairs[:]
        random.shuffle(shuffled)
        assert exposed_names_assign(shuffled) == first


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "object", "properties": {"q": {"type": "string"}}},
         {"type": "object", "properties": {"q": {"type": "string"}}}),
        # Missing type and properties are filled in.
        ({}, {"type": "object", "properties": {}}),
        ({"properties": {"n": {"type": "integer"}}},
         {"type": "object", "properties": {"n": {"type": "integer"}}}),
        # The document's dialect and id are dropped.
        ({"$schema": "http://json-schema.org/draft-07/schema#", "$id": "urn:x",
          "type": "object", "properties": {}},
         {"type": "object", "properties": {}}),
        # Local references that resolve are kept.
        ({"type": "object", "$defs": {"p": {"type": "string"}},
          "properties": {"a": {"$ref": "#/$defs/p"}}},
         {"type": "object", "$defs": {"p": {"type": "string"}},
          "properties": {"a": {"$ref": "#/$defs/p"}}}),
    ],
)
def test_schemas_that_can_be_offered(schema: dict[str, Any], expected: dict[str, Any]) -> None:
    before = repr(schema)
    assert function_parameters_build(schema) == expected
    assert repr(schema) == before


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ([], "not a JSON object"),
        ({"type": "string"}, "not 'object'"),
        ({"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
         "anyOf at the top level"),
        ({"type": "object", "properties": []}, "not a valid JSON Schema"),
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "not a valid JSON Schema"),
        ({"type": "object", "required": "a"}, "not a valid JSON Schema"),
        ({"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
         "points outside the schema"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
         "does not resolve"),
        ({"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100}
                                           for i in range(1000)}},
         "more than 100000"),
    ],
)
def test_schemas_that_are_quarantined(schema: Any, reason: str) -> None:
    with pytest.raises(ToolSchemaError, match=re.escape(reason)):
        function_parameters_build(schema)
