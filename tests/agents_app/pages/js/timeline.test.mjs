// Tests of agents_app/static/agents_app/timeline.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { durationText, groupSteps, outcomeText } from "../../../../agents_app/static/agents_app/timeline.mjs";

const entry = (id, method, extra = {}) => ({
  step_type: id.replace(/-\d+$/, ""), step_execution_id: id, method, status: "completed",
  final_attempt: 1, duration_seconds: 0.1, tool_call_id: null, ...extra,
});

test("a Step's methods are grouped under it, oldest Step first", () => {
  const steps = groupSteps([
    entry("RunModel-1", "execute", { final_attempt: 2, failed_attempt: 1, error: "HTTP 503" }),
    entry("CallTool-1", "wait_for", { tool_call_id: "call_1" }),
    entry("CallTool-1", "execute", { tool_call_id: "call_1" }),
  ]);
  assert.deepEqual(steps.map((step) => [step.id, step.status, step.methods.length, step.toolCallId]), [
    ["RunModel-1", "completed", 1, null],
    ["CallTool-1", "completed", 2, "call_1"],
  ]);
});

test("a failed method fails its Step", () => {
  const [step] = groupSteps([entry("CallTool-2", "execute", { status: "failed", final_attempt: 3 })]);
  assert.equal(step.status, "failed");
});

test("Steps seen in events but not ended in the history are running", () => {
  const running = new Map([["AwaitToolApproval-1", 1], ["RunModel-2", 2], ["RunModel-1", 1]]);
  const steps = groupSteps([entry("RunModel-1", "execute"), entry("AwaitToolApproval-1", "wait_for")], running);
  assert.deepEqual(steps.map((step) => [step.id, step.status]), [
    ["RunModel-1", "completed"],
    ["AwaitToolApproval-1", "running"],
    ["RunModel-2", "running"],
  ]);
  assert.equal(steps[2].attempt, 2);
});

test("durations read in seconds, then minutes", () => {
  assert.equal(durationText(0.4213), "0.42 s");
  assert.equal(durationText(12.4), "12 s");
  assert.equal(durationText(185), "3 min 05 s");
  assert.equal(durationText(undefined), "0.00 s");
});

test("a wait still open is waiting; one that ended waited until its Step ran on", () => {
  const steps = groupSteps([
    entry("AwaitToolApproval-1", "wait_for", { started_at: "2026-01-05T15:14:52Z", tool_name: "slack__post_message", tool_call_id: "call_1" }),
    entry("AwaitToolApproval-1", "execute", { started_at: "2026-01-05T15:17:35Z", outcome: "approved", tool_call_id: "call_1" }),
    entry("AwaitUserMessage-1", "wait_for", { started_at: "2026-01-05T15:17:37Z" }),
  ]);
  assert.deepEqual(steps.map((step) => [step.id, step.status, step.toolName]), [
    ["AwaitToolApproval-1", "approved", "slack__post_message"],
    ["AwaitUserMessage-1", "waiting", null],
  ]);
  assert.equal((steps[0].waitEnd - steps[0].waitStart) / 1000, 163);
  assert.equal(steps[1].waitEnd, null);
});

test("a Step's recorded outcome is its status", () => {
  const steps = groupSteps([
    entry("RunModel-1", "execute", { outcome: "failed", outcome_detail: "HTTP 400" }),
    entry("RunModel-2", "execute", { outcome: "cancelled" }),
    entry("AwaitToolApproval-1", "wait_for"),
    entry("AwaitToolApproval-1", "execute", { outcome: "withdrawn" }),
    entry("AwaitToolApproval-2", "wait_for"),
    entry("AwaitToolApproval-2", "execute", { outcome: "expired" }),
    entry("CallTool-1", "execute", { outcome: "not-a-status" }),
  ]);
  assert.deepEqual(steps.map((step) => step.status), ["failed", "cancelled", "withdrawn", "expired", "completed"]);
});

test("an outcome's label is said once, even when its detail starts with it", () => {
  assert.deepEqual(outcomeText({ outcome: "withdrawn", outcome_detail: "Withdrawn: the user cancelled the turn." }),
    { label: "Withdrawn", detail: "the user cancelled the turn." });
  assert.deepEqual(outcomeText({ outcome: "rejected", outcome_detail: "too risky" }), { label: "Rejected", detail: "too risky" });
  assert.deepEqual(outcomeText({ outcome: "other", outcome_detail: "Withdrawn: x" }), { label: "Ended", detail: "Withdrawn: x" });
  assert.equal(outcomeText({ outcome: "failed", outcome_detail: "" }), null);
});
