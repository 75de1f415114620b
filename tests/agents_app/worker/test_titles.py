"""Session titles: the first line that is not a demo directive, and the answer of a model asked
for a title (``agents_app.worker.titles``); generated titles end to end are in
``tests/e2e/test_session_index.py``."""

from __future__ import annotations

import datetime
import re

import pytest

from agents_app.demo import script
from agents_app.demo.script import plan_reply
from agents_app.worker.titles import (
    DEMO_DIRECTIVE_LINE,
    TITLE_MAX_CHARS,
    clean_title,
    fallback_title,
    shorten_title,
    title_from_message,
    title_request_messages,
)


@pytest.mark.parametrize(
    ("message", "title"),
    [
        ("hello", "hello"),
        ("  first line  \nsecond", "first line"),
        ("/think\n/slow 0.3\nwhat is dex?", "what is dex?"),
        ('/tool search__web_search {"query": "x"}\n\nfind it', "find it"),
        ("/thinking about it", "/thinking about it"),  # not a directive
        ("/etc/hosts is broken", "/etc/hosts is broken"),
        ("/think\n/wait 5 later", ""),
        ("", ""),
        # One word longer than a title: cut inside it, with an ellipsis.
        ("x" * 200, "x" * (TITLE_MAX_CHARS - 1) + "\u2026"),
        ("x" * TITLE_MAX_CHARS, "x" * TITLE_MAX_CHARS),  # fits: not cut
        # Markdown a person typed around the line is not part of the title.
        ("# Heading", "Heading"),
        ("## **Plan** for _Q3_ ##", "Plan for Q3"),
        ("***both*** and `code` and ~~old~~", "both and code and old"),
        ("fix snake_case_names", "fix snake_case_names"),
        ("#\n\n**real** line", "real line"),  # a line of markers only is skipped
        ("#hashtag stays", "#hashtag stays"),  # no space: not a heading
        ("2 * 3 * 4", "2 * 3 * 4"),
        # Links keep their text; images their alt text.
        ("read [the docs](https://docs.test/a_b) first", "read the docs first"),
        ('![a chart](https://x.test/c.png "Chart") and [x]()', "a chart and x"),
        ("[not a link] (https://x.test)", "[not a link] (https://x.test)"),
        # Bidi controls and other control characters are dropped.
        ("\u202eevil\u202c title\u2066 \u2069x\x00\x1b[31m", "evil title x[31m"),
        ("tab\there\u200f", "tab here"),
        ("\u202e\u2067", ""),
        ("family \U0001F468\u200d\U0001F469", "family \U0001F468\u200d\U0001F469"),
    ],
)
def test_the_title_is_the_first_line_that_is_not_a_directive(message: str, title: str) -> None:
    assert title_from_message(message) == title


def test_a_long_first_line_is_cut_at_a_word_boundary_with_an_ellipsis() -> None:
    line = (
        "Please compare the quarterly revenue figures of our three regional offices, "
        "then draft a summary for the board"
    )
    title = title_from_message(line)
    assert len(title) <= TITLE_MAX_CHARS
    assert title == (
        "Please compare the quarterly revenue figures of our three regional offices\u2026"
    )
    assert line.startswith(title.removesuffix("\u2026"))


@pytest.mark.parametrize(
    ("text", "max_chars", "shortened"),
    [
        ("Plan the trip to Lisbon", 15, "Plan the trip\u2026"),
        ("Plan the trip to Lisbon", 23, "Plan the trip to Lisbon"),
        ("Plan the trip, then book", 16, "Plan the trip\u2026"),  # no comma before the ellipsis
        ("Plan the trip to", 14, "Plan the trip\u2026"),  # a word that ends at the room stays
        ("a supercalifragilistic word", 12, "a supercali\u2026"),  # one short word: cut inside
    ],
)
def test_shorten_title(text: str, max_chars: int, shortened: str) -> None:
    assert shorten_title(text, max_chars) == shortened
    assert len(shortened) <= max_chars


def test_a_message_of_directives_only_is_named_after_the_agent_and_its_start() -> None:
    started = datetime.datetime(2026, 12, 5, 14, 3, 59, tzinfo=datetime.UTC)
    assert fallback_title(agent_name="Demo agent", started_at=started) == (
        "Demo agent · 2026-12-05 14:03 UTC"
    )


@pytest.mark.parametrize(
    ("answer", "title"),
    [
        ('"Trip to Lisbon."', "Trip to Lisbon"),
        ("Title: Budget review\n\nThis title fits because...", "Budget review"),
        ("\u201cQuarterly plan\u201d", "Quarterly plan"),
        ("**Bold title**", "Bold title"),
        ("  \n", ""),
        ("\u2067\"Hidden\u202e order\"\u2069", "Hidden order"),
    ],
)
def test_a_models_answer_is_cleaned_into_a_title(answer: str, title: str) -> None:
    assert clean_title(answer) == title


def test_the_demo_model_answers_a_title_request_like_a_model() -> None:
    messages = title_request_messages(
        user_text="/think\nplan a trip to lisbon in may please", answer_text="You said: ..."
    )
    reply = plan_reply(messages)
    assert reply.text == '"Plan a trip to lisbon in."'
    assert clean_title(reply.text) == "Plan a trip to lisbon in"
    assert reply.tool_calls == []


def test_every_directive_the_demo_model_reads_is_left_out_of_titles() -> None:
    """A directive added to the demo model's script (``agents_app.demo.script``) without its
    word in ``DEMO_DIRECTIVE_LINE`` would name sessions after it."""
    words = {
        match.group(1)
        for value in vars(script).values()
        if isinstance(value, re.Pattern)
        for match in [re.search(r"/(\w+)", value.pattern)]
        if match
    }
    assert {"tool", "wait", "ask", "fail", "slow", "think", "big", "context", "stop"} <= words
    missing = sorted(word for word in words if not DEMO_DIRECTIVE_LINE.match(f"/{word} 1"))
    assert not missing, f"directives that DEMO_DIRECTIVE_LINE leaves in titles: {missing}"
