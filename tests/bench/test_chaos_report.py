"""The chaos report's rendering (``bench/chaos_report.py``): pure, no processes."""

from __future__ import annotations

from datetime import UTC, datetime

from bench.chaos_report import ChaosReport, Machine, Row, ScenarioResult, report_render

MACHINE = Machine(cores=2, ram_gib=7.8, cpu="Test CPU", python="3.11.2", kernel="Linux 6.1")


def report(*scenarios: ScenarioResult) -> ChaosReport:
    return ChaosReport(started_at=datetime(2026, 12, 2, 5, 30, tzinfo=UTC), machine=MACHINE,
                       command="make chaos", configuration={"sessions": "50"},
                       scenarios=list(scenarios), total_seconds=90)


def test_counts_meet_their_goal_only_when_equal() -> None:
    scenario = ScenarioResult("Worker", "Kills.")
    scenario.count("lost messages", 0, 0)
    scenario.count("duplicates outside the window", 2, 0)
    scenario.count("worker SIGKILLs", 100)
    assert [row.met for row in scenario.rows] == [True, False, None]
    assert not scenario.goals_met


def test_the_page_states_date_machine_configuration_and_command() -> None:
    scenario = ScenarioResult("Engine SIGKILL", "Twenty restarts.", seconds=42)
    scenario.count("committed messages lost", 0, 0)
    page = report_render(report(scenario))
    assert "- Date: 2026-12-02 05:30 UTC; the run took 1.5 min; every goal met." in page
    assert "- Machine: 2 cores (Test CPU), 7.8 GiB RAM, Python 3.11.2, Linux 6.1." in page
    assert "- Configuration: sessions 50." in page
    assert "- Rerun: `make chaos`." in page
    assert "## Engine SIGKILL\n\nTwenty restarts.\n\nTook 42 s.\n" in page
    assert "| committed messages lost | 0 | 0 |" in page


def test_a_missed_goal_is_marked_and_notes_follow_the_table() -> None:
    scenario = ScenarioResult("Worker", "Kills.")
    scenario.rows.append(Row("duplicate posts | outside", "1", "0", False))
    scenario.rows.append(Row("restart, max", "3.2 s"))
    scenario.notes.append("`chaos w1.2` was posted 2 times\nbetween kills")
    page = report_render(report(scenario))
    assert "some goals missed (marked below)" in page
    assert "| duplicate posts \\| outside | 1 | 0 (**missed**) |" in page
    assert "| restart, max | 3.2 s |  |" in page
    assert page.endswith("| restart, max | 3.2 s |  |\n\n- `chaos w1.2` was posted 2 times "
                         "between kills\n")
