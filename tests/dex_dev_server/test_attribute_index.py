"""The run's attribute index (``dex_dev_server._model.AttributeIndex``) selects what the old walk
over every attribute selected, as the run's attributes are written and deleted."""

from __future__ import annotations

import random

from dex.dexpb import dex_pb2 as pb

from dex_dev_server._model import Run
from dex_dev_server._state import EngineState


def walked(run: Run, selectors: list[str]) -> set[str]:
    """What a task got before the index: every singleton and every selected instance."""
    selected = set(selectors)
    prefixes = tuple(s for s in selected if s.endswith("/"))
    return {
        key for key in run.attributes
        if "/" not in key or key in selected or (prefixes and key.startswith(prefixes))
    }


def test_the_index_selects_what_a_walk_over_every_attribute_selected() -> None:
    rng = random.Random(26)
    run = Run(flow_id="f", run_id="r", seq=1, flow_type="t", status=0, request_id="q",
              start_ts=0.0, first_run_id="r", config=pb.FlowConfig(),
              start_request=pb.StartFlowRequest())
    keys = ["STATE", "USAGE", "PLAN", *(f"MESSAGES/{n:012d}" for n in range(40)),
            *(f"CALLS/call-{n}" for n in range(8)), "CALLS2/x", "TEXT_PARTS/turn-1%3Aa%3A00000"]
    run.attributes.update({key: pb.Value(string_value=key) for key in keys[:10]})
    engine = object.__new__(EngineState)
    for step in range(600):
        key = rng.choice(keys)
        deleted = rng.random() < 0.35
        value = pb.Value(null_value="NULL_VALUE") if deleted else pb.Value(string_value=key)
        engine.set_attribute(run, key, value, inline=True)
        selectors = rng.sample(
            ["MESSAGES/", "CALLS/", "CALLS2/", "CALLS/call-1", "MESSAGES/000000000007",
             "NOPE/", "TEXT_PARTS/turn-1%3Aa", "STATE"], k=rng.randint(0, 4))
        got = [kv.key for kv in EngineState.attributes_for(engine, run, selectors)]
        assert len(got) == len(set(got)), step
        assert set(got) == walked(run, selectors), (step, selectors)
        for kv in EngineState.attributes_for(engine, run, selectors):
            assert kv.value == run.attributes[kv.key]
