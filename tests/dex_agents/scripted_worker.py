"""The Worker child of the dex_agents integration tests."""

import os

from dex_agents.testing import WORKER_TASK_SLOTS, run_agent_worker
from tests.dex_agents.scripted_agent import WORKER_FLOW_TYPES_ENV, WORKER_SLOTS_ENV, build_flows

if __name__ == "__main__":
    slots = int(os.environ.get(WORKER_SLOTS_ENV) or WORKER_TASK_SLOTS)
    served = set(filter(None, os.environ.get(WORKER_FLOW_TYPES_ENV, "").split(",")))
    flows = [flow for flow in build_flows() if not served or flow.get_flow_type() in served]
    run_agent_worker(flows, max_concurrent_tasks=slots)
