"""Kill -9 inside blob writes, blob collection and hydration (``_crash`` points).

The engine SIGKILLs itself at a seeded visit of each point while a LedgerFlow runs: inside
the transaction that stores a Step's blob-backed Attributes and input, inside one that
deletes blobs whose last reference went, right after such a commit, and in ``LoadBlobs``
while the worker hydrates a task. After each kill the engine restarts on the same
database: no stored reference lacks its blob, the start leaves no blob without a reference,
and the Flow finishes with every page checked by the Step that read it.
"""

from __future__ import annotations

import random
import signal
from datetime import timedelta

import pytest
from dex import FlowConfig, StartFlowOptions

from dex_dev_server._crash import CRASH_ENV

from . import flows
from .blob_audit import audit
from .conftest import DexEnv, eventually
from .test_blob_collection import assert_clean, blob_id
from .test_blobs import attributes

SEED = 20_261_205
POINTS = ("blob-write", "blob-collect", "blob-committed", "load-blobs")
PAGES = 30


@pytest.fixture
def engine_args() -> list[str]:
    return ["--blob-threshold", "1024"]


async def test_sigkills_at_blob_points_leave_a_consistent_store_and_the_flow_finishes(
    dex: DexEnv, monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(SEED)
    engine = dex.engine
    assert engine.proc is not None
    # The fixture's engine has no crash plan; each start below arms one point.
    engine.kill()
    for round_no, point in enumerate(rng.sample(POINTS, len(POINTS))):
        # Visit 1 of blob-write is the StartFlow of round 0, which must be acknowledged.
        monkeypatch.setenv(CRASH_ENV, f"{point}:{rng.randint(2, 4)}")
        engine.start()
        if round_no == 0:
            await dex.client.start_flow(
                flows.LEDGER, "ledger-1", flows.ledger_input(1, PAGES),
                # Runs continue as new every few Steps, so references move between runs.
                StartFlowOptions(config_override=FlowConfig(continue_as_new_threshold=7)),
            )
        process = engine.proc
        assert process is not None
        await eventually(lambda p=process: p.poll() is not None, within=20)
        assert process.returncode == -signal.SIGKILL, (point, process.returncode)
        check = audit(engine.db)
        assert not check.dangling, (point, check.dangling)

    monkeypatch.delenv(CRASH_ENV)
    engine.start()
    # A kill can leave no blob that a restart does not collect.
    assert_clean(engine.db)
    result = await dex.client.wait_for_flow("ledger-1", timedelta(seconds=30))
    assert result.single_output(str) == f"{PAGES} pages"
    stored = await attributes(engine.address, "ledger-1")
    assert sorted(stored) == ["ledger", f"ledger_pages/{PAGES - 1}", f"ledger_pages/{PAGES}"]
    assert blob_id(stored["ledger"]) == blob_id(stored[f"ledger_pages/{PAGES}"])
    assert_clean(engine.db)
    # Of the 2 x PAGES distinct blobs written (a page and a Step input per Step), the pages
    # nothing references any more were collected; the inputs stay, in the history.
    assert PAGES + 2 <= len(audit(engine.db).stored) < 2 * PAGES
