"""The Worker child of the dex_agents integration tests."""

from dex_agents.testing import run_agent_worker
from tests.dex_agents.scripted_agent import build_flows

if __name__ == "__main__":
    run_agent_worker(build_flows())
