// Tests of agents_app/static/agents_app/activity.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { activityRow, announcedMessageId } from "../../../../agents_app/static/agents_app/activity.mjs";

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
