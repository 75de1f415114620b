"""Full-text search over sessions' messages (issue 27, "Sessions").

The Dex worker's session observer reports the user message that starts each turn and the
messages a completed turn stores (``dex_agents.ObservedMessage``); ``session_changes_apply``
writes them here, in the transaction that writes the session index, as ``SessionMessageText``
rows keyed by session and sequence (a repeated Step attempt overwrites its row). Migration
0016 puts a full-text index beside the table: FTS5 on SQLite (kept by triggers), a GIN index
over ``to_tsvector('simple', text)`` on PostgreSQL. ``message_texts_backfill`` (the
``sessionsearch_index`` command) fills it from Dex for sessions older than the index.

Queries are words: each word matches a word of a message that starts with it (prefix), and a
message matches when it has every word. Anything but letters, digits and ``_`` separates
words, so no query syntax reaches either engine.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection
from django.db.models.expressions import RawSQL

from agents_app.models import AgentSession, SessionMessageText
from dex_agents import ObservedMessage

logger = logging.getLogger(__name__)

#: Characters of a message's text the index keeps (the composer's limit).
SEARCH_TEXT_MAX_CHARS = 100_000
#: Words of a query that count; the rest are ignored.
SEARCH_MAX_WORDS = 8
#: Characters of one word that count.
SEARCH_MAX_WORD_CHARS = 64
#: Marks around a matched word in the engines' snippets (control characters a message's
#: text, as indexed, does not contain: ``_indexed_text`` drops them).
_MARK_START, _MARK_END = "\x02", "\x03"
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_WORD = re.compile(r"\w+", re.UNICODE)
_FTS_TABLE = "agents_app_sessionmessagetext_fts"
_TABLE = "agents_app_sessionmessagetext"


def search_words(text: str) -> list[str]:
    """The words of a query, lowercased: at most ``SEARCH_MAX_WORDS`` of at most
    ``SEARCH_MAX_WORD_CHARS`` characters each."""
    return [word.lower()[:SEARCH_MAX_WORD_CHARS] for word in _WORD.findall(text)][
        :SEARCH_MAX_WORDS
    ]


def _indexed_text(text: str) -> str:
    return _CONTROL.sub(" ", text[:SEARCH_TEXT_MAX_CHARS])


# --- writes ------------------------------------------------------------------------------------


def message_texts_apply(*, session_id: str, messages: Sequence[ObservedMessage]) -> int:
    """Upsert ``messages`` of ``session_id`` into the search index (by sequence).

    Returns:
        The number of rows written.
    """
    rows = [
        SessionMessageText(
            session_id=session_id,
            sequence=message.sequence,
            role=message.role,
            text=_indexed_text(message.text),
        )
        for message in messages
        if message.role in ("user", "assistant") and message.text.strip()
    ]
    if not rows:
        return 0
    SessionMessageText.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["session", "sequence"],
        update_fields=["role", "text"],
    )
    return len(rows)


def message_texts_backfill(*, session_ids: Iterable[str] | None = None) -> int:
    """Index the stored user and assistant messages of ``session_ids`` (default: every
    session) read from Dex, a page of 200 at a time; sessions Dex does not know or does not
    answer for are skipped (logged).

    Returns:
        The number of messages indexed.
    """
    from agents_app.gateway import dex_gateway

    sessions = AgentSession.objects.all()
    if session_ids is not None:
        sessions = sessions.filter(pk__in=list(session_ids))
    indexed = 0
    for session_id in sessions.values_list("pk", flat=True).iterator():
        after = 0
        try:
            while True:
                page = dex_gateway.run(
                    dex_gateway.session_messages(
                        session_id=session_id, after_sequence=after, limit=200
                    )
                )
                if not page:
                    break
                indexed += message_texts_apply(
                    session_id=session_id,
                    messages=[
                        ObservedMessage(int(item["sequence"]), str(item["role"]), item["text"])
                        for item in page
                        if isinstance(item.get("text"), str)
                    ],
                )
                after = int(page[-1]["sequence"])
        except (dex_gateway.SessionNotFoundError, dex_gateway.EngineUnavailableError) as error:
            logger.warning("Session %s not indexed for search: %s", session_id, error)
    return indexed


# --- reads -------------------------------------------------------------------------------------


def _fts5_query(words: Sequence[str]) -> str:
    return " ".join(f'"{word}"*' for word in words)


def _tsquery(words: Sequence[str]) -> str:
    return " & ".join(f"{word}:*" for word in words)


def matching_session_ids(*, words: Sequence[str]) -> RawSQL:
    """A subquery of the IDs of sessions with a message holding every word of ``words``
    (prefixes), for ``filter(pk__in=...)``; ``words`` must not be empty."""
    if connection.vendor == "postgresql":
        return RawSQL(
            f"SELECT session_id FROM {_TABLE} WHERE "
            "to_tsvector('simple'::regconfig, text) @@ to_tsquery('simple'::regconfig, %s)",
            [_tsquery(words)],
        )
    return RawSQL(
        f"SELECT m.session_id FROM {_FTS_TABLE} f JOIN {_TABLE} m ON m.id = f.rowid "
        f"WHERE {_FTS_TABLE} MATCH %s",
        [_fts5_query(words)],
    )


@dataclasses.dataclass(frozen=True)
class MessageMatch:
    """The message of a session that matched a search, for a results list.

    Attributes:
        sequence: The message's sequence in its session.
        role: ``user`` or ``assistant``.
        snippet: Text around the matched words (plain text, ``…`` where cut).
        highlights: ``[start, end)`` character offsets of the matched words in ``snippet``.
    """

    sequence: int
    role: str
    snippet: str
    highlights: tuple[tuple[int, int], ...]

    def as_data(self) -> dict[str, Any]:
        """The API shape: ``{"sequence", "role", "snippet", "highlights": [[start, end]]}``."""
        return {
            "sequence": self.sequence,
            "role": self.role,
            "snippet": self.snippet,
            "highlights": [list(pair) for pair in self.highlights],
        }

    def parts(self) -> list[tuple[str, bool]]:
        """``snippet`` cut into ``(text, matched)`` pieces, for a page to mark."""
        pieces: list[tuple[str, bool]] = []
        at = 0
        for start, end in self.highlights:
            if start > at:
                pieces.append((self.snippet[at:start], False))
            pieces.append((self.snippet[start:end], True))
            at = end
        if at < len(self.snippet):
            pieces.append((self.snippet[at:], False))
        return pieces


def _match_from(sequence: int, role: str, marked: str) -> MessageMatch:
    text: list[str] = []
    highlights: list[tuple[int, int]] = []
    length = 0
    start: int | None = None
    for piece in re.split(f"([{_MARK_START}{_MARK_END}])", marked):
        if piece == _MARK_START:
            start = length
        elif piece == _MARK_END:
            if start is not None and length > start:
                highlights.append((start, length))
            start = None
        else:
            piece = " ".join(piece.split("\n"))
            text.append(piece)
            length += len(piece)
    return MessageMatch(int(sequence), str(role), "".join(text), tuple(highlights))


def message_matches_get(
    *, words: Sequence[str], session_ids: Sequence[str]
) -> dict[str, MessageMatch]:
    """The best-matching message of each of ``session_ids`` for ``words`` (the engine's
    rank; the newest message on a tie), with a snippet around the matched words.

    Returns:
        ``{session_id: MessageMatch}`` for the sessions with a matching message.
    """
    if not words or not session_ids:
        return {}
    marks = ",".join(["%s"] * len(session_ids))
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT session_id, sequence, role, ts_headline('simple'::regconfig, text, q, "
                "%s) FROM " + _TABLE + ", to_tsquery('simple'::regconfig, %s) q "
                "WHERE session_id IN (" + marks + ") AND "
                "to_tsvector('simple'::regconfig, text) @@ q "
                "ORDER BY session_id, ts_rank(to_tsvector('simple'::regconfig, text), q) DESC, "
                "sequence DESC",
                [
                    f"StartSel={_MARK_START}, StopSel={_MARK_END}, MaxWords=24, MinWords=8, "
                    "ShortWord=1, MaxFragments=1, FragmentDelimiter=\" … \"",
                    _tsquery(words),
                    *session_ids,
                ],
            )
        else:
            cursor.execute(
                f"SELECT m.session_id, m.sequence, m.role, snippet({_FTS_TABLE}, 0, %s, %s, "
                f"'…', 16) FROM {_FTS_TABLE} f JOIN {_TABLE} m ON m.id = f.rowid "
                f"WHERE {_FTS_TABLE} MATCH %s AND m.session_id IN ({marks}) "
                "ORDER BY m.session_id, f.rank, m.sequence DESC",
                [_MARK_START, _MARK_END, _fts5_query(words), *session_ids],
            )
        rows = cursor.fetchall()
    matches: dict[str, MessageMatch] = {}
    for session_id, sequence, role, marked in rows:
        if session_id not in matches:
            matches[session_id] = _match_from(sequence, role, marked or "")
    return matches
