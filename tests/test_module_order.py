"""The test modules' hand-out order (``tests/module_order.py``)."""

from dataclasses import dataclass

from tests.module_order import UNLISTED_E2E_SECONDS, expected_seconds, longest_first


@dataclass
class Item:
    nodeid: str


def test_modules_go_longest_first_and_keep_their_tests_in_order() -> None:
    items = [
        Item("tests/a/test_fast.py::test_one"),
        Item("tests/a/test_fast.py::test_two"),
        Item("tests/e2e/test_unlisted.py::test_one"),
        Item("tests/a/test_slow.py::test_one[x]"),
        Item("tests/a/test_slow.py::test_one[y]"),
        Item("tests/a/test_also_fast.py::test_one"),
    ]
    durations = {"tests/a/test_slow.py": 300.0, "tests/a/test_fast.py": 1.0}
    ordered = [item.nodeid for item in longest_first(items, durations)]
    assert ordered == [
        "tests/a/test_slow.py::test_one[x]",
        "tests/a/test_slow.py::test_one[y]",
        "tests/e2e/test_unlisted.py::test_one",
        # Unlisted outside tests/e2e (5 s) before the listed 1 s module.
        "tests/a/test_also_fast.py::test_one",
        "tests/a/test_fast.py::test_one",
        "tests/a/test_fast.py::test_two",
    ]
    assert expected_seconds(durations, "tests/e2e/test_unlisted.py") == UNLISTED_E2E_SECONDS
