// Tests of agents_app/static/agents_app/turn_notice.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { platformResultText, readTurnNotice } from "../../../../agents_app/static/agents_app/turn_notice.mjs";

test("a cancelled turn's note says which calls ran and which never did, without JSON", () => {
  const notice = readTurnNotice([
    "[Dex] The previous turn was cancelled; its tool calls ended as follows (cancelled ones did not run):",
    '- search__web_search {"query": "a -> b"} -> succeeded: {"results": [1, 2]}',
    "  more output",
    '- slack__post_message {"channel": "general"} -> cancelled: {"status": "cancelled", "reason": "turn_cancelled_by_user"}',
    '- durable_wait {"duration_seconds": 600} -> succeeded: {"status": "interrupted", "reason": "turn_cancelled_by_user"}',
    "Do not repeat these tool calls unless the user asks again.",
  ].join("\n"));
  assert.deepEqual(notice.lines, ["This turn was cancelled. Its tool calls:"]);
  assert.deepEqual(notice.calls.map((call) => [call.tool, call.ending]), [
    ["search__web_search", "ran"],
    ["slack__post_message", "cancelled; it did not run"],
    ["durable_wait", "started, then interrupted"],
  ]);
  assert.deepEqual(notice.calls.map((call) => [call.label, call.builtin]), [
    ["search__web_search", false], ["slack__post_message", false], ["the wait", true],
  ]);
  assert.equal(notice.calls[2].status, "interrupted");
  assert.ok(!JSON.stringify(notice).includes("turn_cancelled_by_user"));
});

test("a guard's reason is kept; a note in no known shape comes back whole", () => {
  const stopped = readTurnNotice("[Dex] Too many tool calls.\nThe turn was stopped after its last model call; these tool calls of the turn ended (cancelled ones did not run):\n- a {} -> outcome_unknown: x");
  assert.deepEqual(stopped.lines, ["Too many tool calls.", "The turn was stopped after its last model call. Its tool calls:"]);
  assert.deepEqual(stopped.calls.map((call) => call.ending), ["may or may not have run"]);
  assert.deepEqual(readTurnNotice("[Dex] Something else."), { lines: ["Something else."], calls: [] });
  assert.deepEqual(readTurnNotice("[Dex] The previous turn was cancelled before the model answered; no tool call ran.").lines,
    ["This turn was cancelled before the model answered; no tool call ran."]);
});

test("built-ins read as the question and the wait; a question open at the cancel was asked, then cancelled", () => {
  const notice = readTurnNotice([
    "[Dex] The previous turn was cancelled; its tool calls ended as follows (cancelled ones did not run):",
    '- request_user_input {"prompt": "Which city?"} -> cancelled: {"status": "cancelled", "reason": "turn_cancelled_by_user"}',
    '- durable_wait {"duration_seconds": 60} -> cancelled: {"status": "cancelled", "reason": "turn_cancelled_by_user"}',
    '- request_user_input {"prompt": "Sure?"} -> succeeded: {"status": "waiting_for_user", "prompt": "Sure?", "choices": []}',
    "Do not repeat these tool calls unless the user asks again.",
  ].join("\n"));
  assert.deepEqual(notice.calls.map((call) => [call.label, call.ending]), [
    ["the question", "asked, then cancelled"],
    ["the wait", "cancelled; it did not run"],
    ["the question", "asked and answered"],
  ]);
  assert.ok(notice.calls.every((call) => call.builtin));
  assert.ok(!JSON.stringify(notice.lines).includes("request_user_input"));
});

test("the platform's own JSON results read as sentences; other results are left alone", () => {
  assert.equal(platformResultText('{"status": "cancelled", "reason": "superseded_by_steered_user_message"}'),
    "Cancelled: a steered message replaced this call.");
  assert.equal(platformResultText('{"status": "cancelled", "reason": "turn_cancelled_by_user"}', "slack__post_message"),
    "Cancelled: the turn was cancelled before this call ran.");
  assert.equal(platformResultText('{"status": "cancelled", "reason": "superseded_by_user_input"}'),
    "Cancelled: the assistant asked a question instead.");
  assert.equal(platformResultText('{"status": "cancelled", "reason": "turn_stopped", "detail": "Too many tool calls."}'),
    "Cancelled: the turn was stopped before this call ran (Too many tool calls).");
  assert.equal(platformResultText('{"status": "interrupted", "reason": "turn_cancelled_by_user"}', "durable_wait"),
    "Interrupted: the turn was cancelled during the wait.");
  assert.equal(platformResultText('{"status": "completed", "duration_seconds": 60, "reason": "build"}', "durable_wait"), "Waited 60 s: build");
  assert.equal(platformResultText('{"status": "waiting_for_user", "prompt": "Which?", "choices": []}', "request_user_input"), "Asked: Which?");
  assert.equal(platformResultText('{"status": "updated", "revision": 2, "task_count": 3}', "write_todos"), "Updated the plan: 3 tasks.");
  // Another tool's result of the same shape, extra keys, other JSON and plain text stay as they are.
  assert.equal(platformResultText('{"status": "completed", "duration_seconds": 60, "reason": "x"}', "ci__build"), null);
  assert.equal(platformResultText('{"status": "cancelled", "reason": "turn_cancelled_by_user", "id": 4}'), null);
  assert.equal(platformResultText('{"status": "cancelled", "reason": "other"}'), null);
  assert.equal(platformResultText('["cancelled"]'), null);
  assert.equal(platformResultText("Tool call was rejected and did not run: no"), null);
});

test("a cancelled subagent call does not claim it never ran", () => {
  const notice = readTurnNotice([
    "[Dex] The previous turn was cancelled; its tool calls ended as follows (cancelled ones did not run):",
    '- agent__demo {"task": "post"} -> cancelled: {"status": "cancelled", "reason": "turn_cancelled_by_user"}',
  ].join("\n"));
  assert.equal(notice.calls[0].ending, "cancelled; a subagent session it had started was stopped");
});
