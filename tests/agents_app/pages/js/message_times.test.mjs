// Tests of agents_app/static/agents_app/message_times.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { dayBreaks, dayKey, dayLabel } from "../../../../agents_app/static/agents_app/message_times.mjs";

// Noon UTC lands on the same calendar day in every time zone from UTC-11 to UTC+11.
const at = (sequence, day) => ({ sequence, created_at: day && `2026-12-0${day}T12:00:00Z` });

test("a separator starts each new day, the first dated message included", () => {
  const breaks = dayBreaks([at(1, 1), at(2, 1), at(3, 3), at(4, 3), at(5, 4)]);
  assert.deepEqual([...breaks.keys()], [1, 3, 5]);
  assert.deepEqual([...breaks.values()], ["2026-12-01", "2026-12-03", "2026-12-04"]);
});

test("messages without a time stay in the day before them and start none", () => {
  const breaks = dayBreaks([at(1, null), at(2, 2), at(3, null), at(4, 2), at(5, 5)]);
  assert.deepEqual([...breaks.keys()], [2, 5]);
  assert.equal(dayBreaks([at(1, null)]).size, 0);
});

test("days are labelled Today, Yesterday, or by their date", () => {
  const now = new Date(2026, 11, 5, 9, 30);
  assert.equal(dayLabel(dayKey(now), now), "Today");
  assert.equal(dayLabel("2026-12-04", now), "Yesterday");
  assert.match(dayLabel("2026-11-30", now), /2026/);
  assert.notEqual(dayLabel("2026-11-30", now), "Yesterday");
  // Across a month boundary.
  assert.equal(dayLabel("2026-11-30", new Date(2026, 11, 1, 0, 5)), "Yesterday");
});
