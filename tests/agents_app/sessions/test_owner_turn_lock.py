"""``agents_app.sessions.outbox_holds.owner_turn_lock``: the check of the running-turn cap and
the write that takes a slot are one step per owner across processes, on SQLite and on PostgreSQL.

Four processes race to take the one slot of one owner (count, a pause that widens the race,
then a write when the count was 0): with the lock exactly one writes. Without it PostgreSQL
lets several write (checked by hand). The project's SQLite settings begin every transaction
IMMEDIATE, which serializes them already; the SQLite side of the lock runs in every e2e test
of the cap (``tests/e2e/test_active_limit.py``)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.e2e.conftest import PYTHON, ROOT
from tests.production_services import (  # noqa: F401 - fixtures
    migrated_postgres_url,
    postgres_url,
)

RACERS = 4
CHILD = """
import sys, time
import django
django.setup()
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from agents_app.sessions.outbox_holds import owner_turn_lock

start = float(sys.argv[1])
while time.time() < start:
    time.sleep(0.005)
owner = get_user_model().objects.get(username="racer")
with transaction.atomic():
    owner_turn_lock(owner_id=owner.pk)
    taken = Group.objects.filter(name__startswith="slot-").count()
    time.sleep(0.3)  # widen the window between the check and the write
    if taken == 0:
        Group.objects.create(name=f"slot-{sys.argv[2]}")
"""


def _race(env: dict[str, str]) -> int:
    """Run the racers against ``env``'s database; how many took the slot."""
    setup = ("import django; django.setup(); "
             "from django.contrib.auth import get_user_model; "
             "get_user_model().objects.create_user('racer')")
    subprocess.run([PYTHON, "-c", setup], cwd=ROOT, env=env, check=True, timeout=120)
    start = time.time() + 3.0
    racers = [subprocess.Popen([PYTHON, "-c", CHILD, str(start), str(number)], cwd=ROOT,
                               env=env, stderr=subprocess.PIPE, text=True)
              for number in range(RACERS)]
    for racer in racers:
        _, errors = racer.communicate(timeout=120)
        assert racer.returncode == 0, errors
    count = subprocess.run(
        [PYTHON, "-c", "import django; django.setup(); "
         "from django.contrib.auth.models import Group; "
         "print(Group.objects.filter(name__startswith='slot-').count())"],
        cwd=ROOT, env=env, check=True, timeout=120, capture_output=True, text=True,
    )
    return int(count.stdout.strip())


def _env(tmp_path: Path, database_url: str) -> dict[str, str]:
    import os

    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env.update({"DATABASE_URL": database_url, "DEXAGENTS_VAR_DIR": str(tmp_path / "var"),
                "DJANGO_SETTINGS_MODULE": "dexagents_site.settings"})
    (tmp_path / "var").mkdir(exist_ok=True)
    return env


def test_one_owner_takes_one_slot_on_postgres(
    tmp_path: Path, migrated_postgres_url: str  # noqa: F811 - the fixture
) -> None:
    assert _race(_env(tmp_path, migrated_postgres_url)) == 1
