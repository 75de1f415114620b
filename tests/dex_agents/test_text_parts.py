"""Splitting texts into parts of bounded UTF-8 size (``dex_agents._text_parts``)."""

from __future__ import annotations

import pytest

from dex_agents._text_parts import (
    MAX_STORED_TEXT_BYTES,
    cut_stored_text,
    read_part,
    split_text,
    text_part_key,
)


@pytest.mark.parametrize("part_bytes", [4, 5, 7, 64, 1000])
def test_parts_join_to_the_text_and_never_split_a_character(part_bytes: int) -> None:
    text = "aé漢😀" * 300 + "tail"
    parts = split_text(text, part_bytes)
    assert "".join(parts) == text
    assert all(0 < len(part.encode()) <= part_bytes for part in parts)
    assert len(parts) >= len(text.encode()) // part_bytes


def test_a_short_text_is_one_part_and_out_of_range_parts_are_none() -> None:
    assert split_text("") == [""]
    assert split_text("abc") == ["abc"]
    assert read_part("abc", 0) == ("abc", 1)
    assert read_part("abc", 1) == (None, 1)
    assert read_part("abc", -1) == (None, 1)
    with pytest.raises(ValueError, match="at least 4"):
        split_text("abc", 3)


def test_part_keys_sort_in_part_order() -> None:
    keys = [text_part_key("turn-1:call", index) for index in (0, 9, 10, 99, 100)]
    assert keys == sorted(keys)


def test_a_text_past_the_stored_limit_is_cut_with_a_note() -> None:
    assert cut_stored_text("é" * 10, limit=600) == "é" * 10
    cut = cut_stored_text("é" * 1000, limit=600)  # 2,000 bytes; 88 bytes of text fit
    assert cut.startswith("é" * 44 + "\n\n[dexagents] The session stored the first 44 of 1,000 ")
    assert len(cut.encode()) <= 600
    assert MAX_STORED_TEXT_BYTES == 32 * 1024 * 1024
