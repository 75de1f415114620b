"""Session titles (issue 27, "Titles").

A session is first named after its first message: the first line that is not a demo model
directive (``/think``, ``/slow 0.3``, ``/tool ...``: lines that steer the demo model, not what the
person asked), without its Markdown heading and emphasis markers, shortened to
:data:`TITLE_MAX_CHARS` at a word boundary with an ellipsis (``shorten_title``); a session
started without a message is named after its agent until its first message, and one whose
first message is all directives after its agent and start time (``fallback_title``). After
the first turn, a short title is written by the agent's own model:
one Chat Completions call made by a Celery task (``agents_app.tasks.generate_session_title``),
off the turn's path, for agents whose ``generate_titles`` is on and while
``DEXAGENTS["GENERATE_TITLES"]`` is true. A title the model cannot write leaves the
first-message title in place.

``AgentSession.title_source`` records where the title came from (``models.TitleSource``). This
module imports no Django, so the demo model process can use it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

TITLE_MAX_CHARS = 80
#: Characters of each message the title request quotes.
TITLE_QUOTE_CHARS = 2_000
#: The title request's system message starts with this (the demo model answers it).
TITLE_REQUEST_PREFIX = "Write a short title for this conversation."
#: Quote marks a model may put around a title (ASCII, typographic double and single, backtick).
QUOTES = "\"'`*\u201c\u201d\u2018\u2019"
#: Lines the demo model reads as directives (``agents_app.demo.script``'s module docstring).
DEMO_DIRECTIVE_LINE = re.compile(
    r"^\s*/(?:tool|wait|ask|fail|slow|think|big|context|stop)(?:\s|$)"
)


#: Bidirectional controls (embeddings, overrides U+202A..U+202E, isolates U+2066..U+2069, and
#: the marks U+200E, U+200F, U+061C): they can reorder how a title and what follows it read.
_BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


def title_without_controls(text: str) -> str:
    """``text`` without bidirectional controls (``_BIDI_CONTROLS``) and other control
    characters (Unicode category ``Cc``: C0, DEL, C1; a tab or line break becomes a space),
    its runs of whitespace made one space, stripped. Emoji joiners and other format
    characters stay."""
    text = _BIDI_CONTROLS.sub("", text)
    text = "".join(
        " " if char.isspace() else char
        for char in text
        if char.isspace() or unicodedata.category(char) != "Cc"
    )
    return " ".join(text.split())


#: A Markdown link or image, ``[text](url)`` / ``![alt](url "title")``: its text stays.
_LINK = re.compile(r"!?\[([^\]\n]*)\]\([^)\s]*(?:\s+\"[^\"]*\")?\)")
#: A Markdown ATX heading's opening (``# ``..``###### ``) and its optional closing ``#``s.
_HEADING_OPEN = re.compile(r"^#{1,6}(?:\s+|$)")
_HEADING_CLOSE = re.compile(r"\s+#+\s*$")
#: Emphasis, strike-through and inline code around a run of text (``**x**``, ``_x_``, ``~~x~~``,
#: `` `x` ``); ``_`` only at word edges, so ``snake_case`` names keep theirs.
_EMPHASIS = re.compile(
    r"(\*\*|\*|~~|`)(?=\S)(.+?)(?<=\S)\1|(?<!\w)(__|_)(?=\S)(.+?)(?<=\S)\3(?!\w)"
)


def plain_title_line(line: str) -> str:
    """``line`` without the Markdown a person typed around it: a heading's ``#`` marks,
    emphasis, strike-through and inline-code markers and link syntax (``"# **Plan** for Q3"``
    becomes ``"Plan for Q3"``, ``"[docs](https://x.test)"`` ``"docs"``), and without control
    characters (``title_without_controls``)."""
    text = title_without_controls(_LINK.sub(lambda match: match.group(1), line))
    if _HEADING_OPEN.match(text):
        text = _HEADING_CLOSE.sub("", _HEADING_OPEN.sub("", text, count=1))
    previous = None
    while previous != text:  # nested markers (``***x***``) unwrap one layer at a time
        previous = text
        text = _EMPHASIS.sub(lambda match: match.group(2) or match.group(4), text)
    return text.strip()


#: What ends a title that was cut (one character, counted in ``TITLE_MAX_CHARS``).
ELLIPSIS = "\u2026"


def shorten_title(text: str, max_chars: int = TITLE_MAX_CHARS) -> str:
    """``text`` when it has at most ``max_chars`` characters, else cut at the last word
    boundary that leaves room for ``ELLIPSIS``, without the punctuation and spaces before
    the cut, and ended by ``ELLIPSIS`` (``"Plan the trip to Lisbon"`` at 15 becomes
    ``"Plan the trip…"``). A first word longer than half the room is cut inside it."""
    if len(text) <= max_chars:
        return text
    room = max_chars - len(ELLIPSIS)
    cut = text[: room + 1]  # the character after the room tells whether a word ends there
    boundary = max((match.start() for match in re.finditer(r"\s", cut)), default=-1)
    kept = cut[:boundary] if boundary >= room // 2 else cut[:room]
    return kept.rstrip(" \t,;:-\u2013\u2014.") + ELLIPSIS


def title_from_message(text: str) -> str:
    """The first line of ``text`` that is not a demo directive and has text once its Markdown
    markers are gone (``plain_title_line``), shortened to ``TITLE_MAX_CHARS`` at a word
    boundary (``shorten_title``); ``""`` when there is none."""
    for line in text.splitlines():
        if line.strip() and not DEMO_DIRECTIVE_LINE.match(line):
            title = plain_title_line(line)
            if title:
                return shorten_title(title)
    return ""


def fallback_title(*, agent_name: str, started_at: datetime) -> str:
    """The title of a session whose first message has no title line (every line a demo
    directive): its agent's name and when it started, ``"Demo agent · 2026-12-05 14:03 UTC"``,
    so that such sessions can be told apart in the list. A later message with a title line
    renames it (``title_source`` ``agent``)."""
    when = started_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return shorten_title(f"{title_without_controls(agent_name)} · {when}")


def title_request_messages(*, user_text: str, answer_text: str) -> list[dict[str, str]]:
    """The Chat Completions messages that ask a model for a title of a conversation that
    starts with ``user_text`` answered by ``answer_text`` (each quoted up to
    ``TITLE_QUOTE_CHARS``)."""
    quoted = f"User: {user_text[:TITLE_QUOTE_CHARS]}"
    if answer_text:
        quoted += f"\n\nAssistant: {answer_text[:TITLE_QUOTE_CHARS]}"
    return [
        {
            "role": "system",
            "content": f"{TITLE_REQUEST_PREFIX} Answer with the title only: at most six words, "
            "no quotes, no final period, in the language of the conversation.",
        },
        {"role": "user", "content": quoted},
    ]


def clean_title(text: str) -> str:
    """A model's answer as a title: its first non-blank line without surrounding quotes,
    ``Title:``, a final period or control characters (``title_without_controls``), shortened
    to ``TITLE_MAX_CHARS`` (``shorten_title``); ``""`` if nothing is left."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    line = re.sub(r"^(?:title\s*:\s*)", "", line, flags=re.IGNORECASE)
    line = title_without_controls(line).strip(QUOTES).strip().rstrip(".").strip()
    return shorten_title(line)


async def title_write(
    *, agent_config: Mapping[str, Any], user_text: str, answer_text: str
) -> str:
    """Ask the agent's model for a title (one non-streamed Chat Completions call, at most 24
    output tokens, the turn's timeout, no retries).

    Args:
        agent_config: The agent's ``agent_config()`` snapshot (model, ``api_base``, key name).

    Returns:
        The cleaned title, ``""`` when the model gave none.

    Raises:
        agent_config.AgentConfigError: The provider is not configured (its key variable is
            unset).
        Exception: What LiteLLM raises for a failed call (the key is never in its text:
            ``provider_errors.provider_failure`` redacts it).
    """
    from agents_app.providers import load_litellm, unpriced_model_pricing
    from agents_app.worker.agent_config import AgentModelConfig
    from agents_app.worker.model_replies import read_chat_response
    from agents_app.worker.model_requests import DEFAULT_MODEL_TIMEOUT
    from agents_app.worker.provider_errors import provider_failure

    config = AgentModelConfig.parse(agent_config)
    api_key = config.api_key()
    call: dict[str, Any] = {
        "model": config.model,
        "messages": title_request_messages(user_text=user_text, answer_text=answer_text),
        "stream": False,
        "max_tokens": 24,
        "timeout": DEFAULT_MODEL_TIMEOUT,
        "max_retries": 0,
        "num_retries": 0,
        **unpriced_model_pricing(config.model),
    }
    if config.api_base:
        call["api_base"] = config.api_base
    if api_key is not None:
        call["api_key"] = api_key
    try:
        response = await load_litellm().acompletion(**call, drop_params=True)
    except Exception as error:
        failure = provider_failure(error, api_key, refusals=False)
        if failure is error:
            raise
        raise failure from None
    return clean_title(read_chat_response(response).text)
