"""The restricted elicitation schema and the checking of answers against it
(``dex_agents.elicitation_form``, ``elicitation_content_check``; MCP 2025-11-25,
"Client features/Elicitation")."""

from __future__ import annotations

from typing import Any

import pytest

from dex_agents import ElicitationSchemaError, elicitation_content_check, elicitation_form

FORM = elicitation_form(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2, "maxLength": 5},
            "site": {"type": "string", "format": "uri"},
            "day": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "date-time"},
            "count": {"type": "integer", "minimum": 1},
            "ratio": {"type": "number", "maximum": 1.5},
            "ok": {"type": "boolean"},
            "pick": {"type": "string", "oneOf": [{"const": "a", "title": "A"}, {"const": "b"}]},
            "many": {"type": "array", "items": {"type": "string", "enum": ["x", "y", "z"]},
                     "maxItems": 2},
        },
        "required": ["name", "ok"],
    }
)


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ([], "not a JSON object"),
        ({"type": "array"}, "not of type object"),
        ({"properties": {"a": {"type": "object", "properties": {}}}}, "has type 'object'"),
        ({"properties": {"a": {"type": "string", "format": "phone"}}}, "unknown format"),
        ({"properties": {"a": {"type": "array", "items": {"type": "string"}}}}, "enum is not"),
        ({"properties": {"a": {"type": "string"}}, "required": ["b"]}, "required names"),
        ({"properties": {"a": {"type": "number", "minimum": "1"}}}, "minimum is not a number"),
    ],
)
def test_a_schema_that_is_not_the_restricted_kind_is_refused(schema: Any, problem: str) -> None:
    with pytest.raises(ElicitationSchemaError, match=problem):
        elicitation_form(schema)


def test_fields_keep_the_servers_order_and_options() -> None:
    assert [field.name for field in FORM.fields][:3] == ["name", "site", "day"]
    pick = next(field for field in FORM.fields if field.name == "pick")
    assert pick.options == (("a", "A"), ("b", "b"))
    assert [field.required for field in FORM.fields if field.name in ("name", "ok")] == [
        True, True
    ]


def test_good_answers_pass_and_are_cleaned() -> None:
    clean, errors = elicitation_content_check(
        FORM,
        {"name": "Ada", "site": "https://example.com/x", "day": "2026-12-04",
         "at": "2026-12-04T15:30:00Z", "count": 3.0, "ratio": 1, "ok": False, "pick": "b",
         "many": ["z", "x"], "ignored": None},
    )
    assert errors == {"": ["Not a field of this form: ignored."]}
    clean, errors = elicitation_content_check(
        FORM, {"name": "Ada", "ok": True, "count": 3.0, "site": "", "many": []}
    )
    assert errors == {}
    assert clean == {"name": "Ada", "ok": True, "count": 3, "many": []}
    assert isinstance(clean["count"], int)


@pytest.mark.parametrize(
    ("content", "field", "message"),
    [
        ({"name": "", "ok": True}, "name", "This field is required."),
        ({"name": "A", "ok": True}, "name", "Enter at least 2 characters."),
        ({"name": "Adaline", "ok": True}, "name", "Enter at most 5 characters."),
        ({"name": 5, "ok": True}, "name", "Enter text."),
        ({"name": "Ada"}, "ok", "This field is required."),
        ({"name": "Ada", "ok": "yes"}, "ok", "Choose yes or no (true or false)."),
        ({"name": "Ada", "ok": True, "site": "not a url"}, "site", "Enter a valid URI"),
        ({"name": "Ada", "ok": True, "day": "04/12/2026"}, "day", "Enter a valid date"),
        ({"name": "Ada", "ok": True, "at": "tomorrow"}, "at", "Enter a valid date and time"),
        ({"name": "Ada", "ok": True, "count": 1.5}, "count", "Enter a whole number."),
        ({"name": "Ada", "ok": True, "count": True}, "count", "Enter a whole number."),
        ({"name": "Ada", "ok": True, "count": 0}, "count", "at least 1"),
        ({"name": "Ada", "ok": True, "ratio": 2}, "ratio", "at most 1.5"),
        ({"name": "Ada", "ok": True, "pick": "c"}, "pick", "Choose one of: a, b."),
        ({"name": "Ada", "ok": True, "many": ["x", "x"]}, "many", "at most once"),
        ({"name": "Ada", "ok": True, "many": ["x", "y", "z"]}, "many", "Choose at most 2."),
        ({"name": "Ada", "ok": True, "many": "x"}, "many", "a list of values"),
    ],
)
def test_each_bad_value_gets_its_own_message(
    content: dict[str, Any], field: str, message: str
) -> None:
    _clean, errors = elicitation_content_check(FORM, content)
    assert list(errors) == [field]
    assert message in errors[field][0]


def test_content_that_is_not_an_object_is_refused_as_a_whole() -> None:
    assert elicitation_content_check(FORM, ["Ada"]) == (
        {}, {"": ["The answer's content must be a JSON object of field values."]}
    )
