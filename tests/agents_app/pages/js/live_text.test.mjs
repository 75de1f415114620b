// Tests of agents_app/static/agents_app/live_text.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { groupKey, LiveText } from "../../../../agents_app/static/agents_app/live_text.mjs";

function delta(text, { turn = "turn-1", step = "s1", attempt = 1, type = "text_delta" } = {}) {
  return { type, turn_id: turn, step_execution_id: step, attempt, data: { text } };
}

test("deltas of one Step attempt are appended in order", () => {
  const live = new LiveText();
  live.apply(delta("Hello "));
  live.apply(delta("world"));
  assert.deepEqual(live.list("response").map((group) => group.text), ["Hello world"]);
});

test("a higher attempt replaces the Step's text and a lower one is ignored", () => {
  const live = new LiveText();
  live.apply(delta("stale partial", { attempt: 1 }));
  const retried = live.apply(delta("fresh", { attempt: 2 }));
  assert.equal(retried.text, "fresh");
  assert.equal(live.apply(delta(" late from attempt 1", { attempt: 1 })), null);
  live.apply(delta(" answer", { attempt: 2 }));
  const [group] = live.list("response");
  assert.equal(group.text, "fresh answer");
  assert.equal(group.attempt, 2);
});

test("Steps and turns are separate groups, in first-seen order", () => {
  const live = new LiveText();
  live.apply(delta("a", { step: "s1" }));
  live.apply(delta("b", { step: "s2" }));
  live.apply(delta("c", { step: "s1" }));
  live.apply(delta("d", { turn: "turn-2", step: "s1" }));
  assert.deepEqual(live.list("response").map((group) => [group.turnId, group.stepExecutionId, group.text]), [
    ["turn-1", "s1", "ac"],
    ["turn-1", "s2", "b"],
    ["turn-2", "s1", "d"],
  ]);
});

test("reasoning goes to Thinking, text to Response, other events nowhere", () => {
  const live = new LiveText();
  live.apply(delta("pondering", { type: "reasoning_delta" }));
  live.apply(delta("answer"));
  assert.equal(live.apply({ type: "tool_call_started", turn_id: "turn-1", data: {} }), null);
  assert.deepEqual(live.list("thinking").map((group) => group.text), ["pondering"]);
  assert.deepEqual(live.list("response").map((group) => group.text), ["answer"]);
  assert.notEqual(groupKey("thinking", "t", "s"), groupKey("response", "t", "s"));
});

test("a turn's groups can be dropped when its stored messages arrive", () => {
  const live = new LiveText();
  live.apply(delta("one", { turn: "turn-1" }));
  live.apply(delta("two", { turn: "turn-2" }));
  assert.equal(live.dropTurn("turn-1"), 1);
  assert.deepEqual([...live.turns()], ["turn-2"]);
  live.clear();
  assert.equal(live.size, 0);
});

test("missing attempt counts as the first and missing text adds nothing", () => {
  const live = new LiveText();
  live.apply({ type: "text_delta", turn_id: "t", step_execution_id: "s", data: {} });
  live.apply({ type: "text_delta", turn_id: "t", step_execution_id: "s", data: { text: "x" } });
  const [group] = live.list("response");
  assert.equal(group.attempt, 1);
  assert.equal(group.text, "x");
});
