"""The chaos suite's command line (``bench/chaos.py``): no processes are started."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import PUBLISHED_REPORT, arguments, failed_turn_notes


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


def test_only_a_run_at_the_full_figures_replaces_the_published_report() -> None:
    assert arguments([]).output == PUBLISHED_REPORT
    for smaller in (["--quick"], ["--kills", "40"], ["--scenarios", "mcp"]):
        output = arguments(smaller).output
        assert output != PUBLISHED_REPORT
        assert output.parent.name == "var" and output.name.startswith("reliability-")
    assert arguments(["--quick", "--output", "x.md"]).output == Path("x.md")


@pytest.mark.parametrize(
    "argv", [["--scenarios", ""], ["--kills", "-1"], ["--sessions", "0"],
             ["--kill-gap", "3", "0.5"], ["--init-timeout", "-5"]],
)
def test_nonsense_figures_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        arguments(argv)
    assert refused.value.code == 2


def test_failed_turns_are_reported_with_their_errors_most_frequent_first() -> None:
    assert failed_turn_notes(["model down", "timeout", "model down"]) == [
        "2 turns ended with the error: model down",
        "1 turn ended with the error: timeout",
    ]
    assert failed_turn_notes([]) == []
    many = failed_turn_notes([f"error {n}" for n in range(12)] + ["error 0"])
    assert many[0] == "2 turns ended with the error: error 0"
    assert len(many) == 11 and many[-1] == "2 more turns ended with 2 other errors."
