// Tests of agents_app/static/agents_app/timeline.mjs (run by tests/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { durationText, groupSteps } from "../../../agents_app/static/agents_app/timeline.mjs";

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
