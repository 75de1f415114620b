"""Full-text session search on PostgreSQL (``agents_app.sessions.session_search``): the
worker's index writes, prefix words, snippets and the GIN index, in a process whose
``DATABASE_URL`` is a migrated PostgreSQL database (``migrated_postgres_url``; skipped when no
server runs, unless ``DEXAGENTS_REQUIRE_SERVICES`` is set).
The SQLite side is ``test_session_manage``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.e2e.conftest import PYTHON, ROOT
from tests.production_services import (  # noqa: F401 - fixtures
    migrated_postgres_url,
    postgres_url,
)

CHILD = """
import datetime, json
import django
django.setup()
from django.contrib.auth import get_user_model
from django.db import connection
from agents_app.models import AgentDefinition, AgentSession, SessionMessageText
from agents_app.selectors.session_reads import session_list_visible
from agents_app.sessions.session_index import session_changes_apply
from agents_app.sessions.session_search import message_matches_get, search_words
from dex_agents import AgentSessionChange, ObservedMessage

owner = get_user_model().objects.create_user("searcher")
other = get_user_model().objects.create_user("other")
agent = AgentDefinition.objects.create(slug="pg", name="PG", model="openai/x")
mine = AgentSession.objects.create(id="ses_" + "1" * 32, owner=owner, agent=agent, title="A")
theirs = AgentSession.objects.create(id="ses_" + "2" * 32, owner=other, agent=agent, title="B")
at = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

def said(session, *messages):
    session_changes_apply(changes=[AgentSessionChange(
        flow_id=session.pk, observed_at=at, status=None, turn_id="turn-1",
        messages=tuple(ObservedMessage(*m) for m in messages))])

said(mine, (1, "user", "Where should I stay in Lisbon?"),
     (2, "assistant", "Alfama is a lovely old quarter of Lisbon with steep streets."))
said(mine, (2, "assistant", "Alfama is a lovely old quarter of Lisbon with steep streets."))
said(theirs, (1, "user", "Lisbon trams & quarters"))
words = search_words("lisb QUARTER")
listed = [s.pk for s in session_list_visible(user=owner, search="lisb QUARTER")]
match = message_matches_get(words=words, session_ids=listed)[mine.pk]
odd = [s.pk for s in session_list_visible(user=owner, search="'): & | ! <-> *")]
with connection.cursor() as cursor:
    cursor.execute("SET enable_seqscan = off")
    cursor.execute(
        "EXPLAIN SELECT session_id FROM agents_app_sessionmessagetext WHERE "
        "to_tsvector('simple'::regconfig, text) @@ to_tsquery('simple'::regconfig, %s)",
        ["lisb:*"])
    plan = " ".join(row[0] for row in cursor.fetchall())
print(json.dumps({
    "listed": listed, "rows": SessionMessageText.objects.count(),
    "match": [match.sequence, match.role, match.snippet,
              [match.snippet[a:b] for a, b in match.highlights]],
    "odd": odd, "plan": plan,
}))
"""


def test_search_on_postgres_uses_the_gin_index(
    tmp_path: Path, migrated_postgres_url: str  # noqa: F811 - the fixture
) -> None:
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env.update({"DATABASE_URL": migrated_postgres_url, "DEXAGENTS_VAR_DIR": str(tmp_path),
                "DJANGO_SETTINGS_MODULE": "dexagents_site.settings"})
    done = subprocess.run([PYTHON, "-c", CHILD], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["listed"] == ["ses_" + "1" * 32]
    assert found["rows"] == 3
    sequence, role, snippet, marked = found["match"]
    assert (sequence, role) == (2, "assistant")
    assert "old quarter of Lisbon" in snippet
    assert [word.lower() for word in marked] == ["quarter", "lisbon"]
    assert found["odd"] == []
    assert "agents_app_sessionmessagetext_fts" in found["plan"]
