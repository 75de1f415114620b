"""The chaos suite's command line (``bench/chaos.py``): no processes are started."""

from __future__ import annotations

import pytest

from bench.chaos import arguments


def test_the_default_is_the_issues_configuration() -> None:
    args = arguments([])
    assert (args.sessions, args.kills, args.engine_kills, args.mcp_cycles) == (50, 100, 20, 100)
    assert args.scenarios == ["worker", "engine", "web", "mcp"]


def test_quick_makes_a_small_run_but_a_given_figure_wins() -> None:
    args = arguments(["--quick", "--web-kills", "3", "--scenarios", "web, mcp"])
    assert (args.sessions, args.kills, args.web_kills) == (6, 8, 3)
    assert args.scenarios == ["web", "mcp"]


def test_an_unknown_scenario_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        arguments(["--scenarios", "worker,disk"])
    assert "unknown scenarios: disk" in capsys.readouterr().err
