// Tests of agents_app/static/agents_app/activity.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { SubagentTally, activityRow, announcedMessageId, subagentGroupLabel, subagentSummary } from "../../../../agents_app/static/agents_app/activity.mjs";

const finished = (data) => activityRow({ type: "tool_call_finished", data: { tool_name: "t", ...data } });

test("a finished call's outcome corrects what its status alone says", () => {
  assert.equal(finished({ tool_name: "durable_wait", status: "succeeded", outcome: "interrupted" }).detail, "durable_wait: interrupted");
  assert.equal(finished({ tool_name: "durable_wait", status: "succeeded", outcome: "completed" }).detail, "durable_wait: completed");
  assert.equal(finished({ tool_name: "request_user_input", status: "succeeded", outcome: "answered" }).detail, "request_user_input: answered");
  const refused = finished({ status: "failed", outcome: "Tool 't' is not enabled for this session." });
  assert.equal(refused.detail, "t: failed (Tool 't' is not enabled for this session.)");
  assert.equal(refused.tone, "error");
  // Without an outcome (events written before it existed) the status is shown as it is.
  assert.equal(finished({ status: "succeeded" }).detail, "t: succeeded");
  assert.equal(finished({ status: "cancelled", outcome: "x" }).detail, "t: cancelled before it ran");
  // A subagent call may have started its child, which the cancel stopped.
  assert.equal(finished({ tool_name: "agent__demo", status: "cancelled" }).detail,
    "agent__demo: cancelled; a subagent session it had started was stopped");
});

test("an approval a steer withdrew reads as withdrawn", () => {
  const event = { type: "interrupt_resolved", data: { interrupt_id: "i1", approved: false, rejection_message: "" } };
  assert.equal(activityRow(event).kind, "Rejected");
  assert.equal(activityRow(event, new Set(["i1"])).kind, "Approval withdrawn");
});

test("only a queued or steered message's announcement names the message a turn takes", () => {
  assert.equal(announcedMessageId({ type: "message_queued", data: { message_id: "m1" } }), "m1");
  assert.equal(announcedMessageId({ type: "queue_changed", data: { change: "steered", message_id: "m2" } }), "m2");
  assert.equal(announcedMessageId({ type: "queue_changed", data: { change: "deleted", message_id: "m3" } }), null);
  assert.equal(announcedMessageId({ type: "message_queued", data: {} }), null);
});

test("a subagent's start and end link its child session's page", () => {
  const started = activityRow({
    type: "subagent_started",
    data: { tool_name: "agent__demo", child_session_id: "SubFlow:ses_1-CallSubagent-1-0", depth: 1 },
  });
  assert.equal(started.kind, "Subagent started");
  assert.equal(started.detail, "agent__demo (depth 1): open its session");
  assert.equal(started.href, "/sessions/SubFlow%3Ases_1-CallSubagent-1-0/");
  const failed = activityRow({
    type: "subagent_finished",
    data: { tool_name: "agent__demo", child_session_id: "c", outcome: "failed" },
  });
  assert.equal(failed.detail, "agent__demo: failed");
  assert.equal(failed.tone, "error");
  assert.equal(activityRow({ type: "subagent_finished", data: { outcome: "completed" } }).href, null);
});

test("a subagent group's summary counts the child's tool calls and says how the call stands", () => {
  assert.equal(subagentSummary({ toolName: "agent__demo", toolCalls: 3, state: "completed" }), "agent__demo: 3 tool calls, finished");
  assert.equal(subagentSummary({ toolName: "agent__demo", toolCalls: 1, state: "running" }), "agent__demo: 1 tool call, running");
  assert.equal(subagentSummary({ toolName: "agent__demo", toolCalls: 0, state: "ended" }), "agent__demo: 0 tool calls, finished");
  assert.equal(subagentSummary({ toolName: "", toolCalls: 0, state: "failed" }), "subagent: 0 tool calls, failed");
  assert.equal(subagentGroupLabel({ toolName: "agent__demo", title: "Post hi", childId: "c" }), "Subagent demo session Post hi");
  assert.equal(subagentGroupLabel({ toolName: "agent__demo", title: "", childId: "SubFlow:s-CallSubagent-1-0" }), "Subagent demo session SubFlow:s-CallSubagent-1-0");
});

test("a child's events are taken once per token, and its turn's end ends the call", () => {
  const tally = new SubagentTally();
  const deferred = { type: "tool_call_deferred", data: { tool_call_id: "call_1", tool_name: "slack__post_message" } };
  assert.equal(tally.take(deferred, "1-0"), true);
  // The live feed and a replay of the same Stream deliver the same token: shown once.
  assert.equal(tally.take(deferred, "1-0"), false);
  assert.equal(tally.take({ type: "tool_call_deferred", data: { tool_call_id: "call_2" } }, "2-0"), true);
  // One call's events after its request add no call.
  assert.equal(tally.take({ type: "tool_call_finished", data: { tool_call_id: "call_1", status: "succeeded" } }, "3-0"), true);
  assert.equal(tally.toolCalls.size, 2);
  assert.equal(tally.state, "running");
  tally.take({ type: "turn_failed", data: { error: "boom" } }, "4-0");
  assert.equal(tally.state, "failed");
  // "ended" (only the index says the child stopped) does not replace a known ending...
  assert.equal(tally.end("ended"), false);
  assert.equal(tally.state, "failed");
  // ...but a known ending replaces "ended".
  const quiet = new SubagentTally();
  assert.equal(quiet.end("ended"), true);
  quiet.take({ type: "turn_completed" }, "9-0");
  assert.equal(quiet.state, "completed");
});
