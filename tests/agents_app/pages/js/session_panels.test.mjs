// Tests of agents_app/static/agents_app/session_panels.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  planCard,
  planExecutable,
  questionPanel,
  statusBadge,
  timerCard,
} from "../../../../agents_app/static/agents_app/session_panels.mjs";

const idle = (extra = {}) => ({
  status: "waiting_for_user_message",
  queued_messages: [],
  steered_messages: [],
  pending_input: null,
  plan_execution_requested: false,
  turn_mode: "planning",
  ...extra,
});
const draft = {
  revision: 1,
  status: "draft",
  tasks: [
    { content: "step one", status: "pending" },
    { content: "step two", status: "pending" },
  ],
};
const active = {
  revision: 3,
  status: "active",
  tasks: [
    { content: "step one", status: "completed" },
    { content: "step two", status: "in_progress" },
  ],
};

test("a draft offers Execute plan and an unfinished active plan Continue plan", () => {
  const card = planCard(idle({ plan: draft }), { canSend: true });
  assert.deepEqual(card.action, { label: "Execute plan", revision: 1 });
  assert.equal(card.progress, "0/2 completed");
  assert.equal(card.statusText, "Draft");
  assert.deepEqual(card.tasks.map((task) => [task.mark, task.statusText, task.content]), [
    ["○", "Pending", "step one"],
    ["○", "Pending", "step two"],
  ]);
  const more = planCard(idle({ plan: active, turn_mode: "executing" }), { canSend: true });
  assert.deepEqual(more.action, { label: "Continue plan", revision: 3 });
  assert.equal(more.progress, "1/2 completed");
  assert.deepEqual(more.tasks.map((task) => task.mark), ["✓", "●"]);
  assert.equal(more.executing, false);
});

test("no action when the engine would refuse it", () => {
  const refused = [
    [idle({ plan: draft }), { canSend: false }], // staff reading, or a stopped session
    [idle({ plan: draft, status: "running_model" }), { canSend: true }],
    [idle({ plan: draft, status: "waiting_for_user_input" }), { canSend: true }],
    [idle({ plan: draft, pending_input: { call_id: "c", prompt: "?" } }), { canSend: true }],
    [idle({ plan: draft, queued_messages: [{ id: "q" }] }), { canSend: true }],
    [idle({ plan: draft, steered_messages: [{ id: "s" }] }), { canSend: true }],
    [idle({ plan: draft }), { canSend: true, waiting: 1 }], // a message being sent
    [idle({ plan: draft, plan_execution_requested: true }), { canSend: true }],
    [idle({ plan: draft }), { canSend: true, requested: true }],
    [idle({ plan: { ...active, status: "completed", tasks: active.tasks.map((task) => ({ ...task, status: "completed" })) } }), { canSend: true }],
    [idle({ plan: { revision: 2, status: "active", tasks: [] } }), { canSend: true }],
  ];
  for (const [snapshot, options] of refused) {
    assert.equal(planCard(snapshot, options).action, null, JSON.stringify([snapshot, options]));
  }
});

test("a requested execution is shown until the plan is completed", () => {
  assert.equal(planCard(idle({ plan: draft, plan_execution_requested: true })).requested, true);
  assert.equal(planCard(idle({ plan: draft }), { requested: true }).requested, true);
  const completed = { ...draft, status: "completed", tasks: draft.tasks.map((task) => ({ ...task, status: "completed" })) };
  const card = planCard(idle({ plan: completed }), { requested: true });
  assert.equal(card.requested, false);
  assert.equal(card.progress, "2/2 completed");
});

test("an executing turn marks the card as executing", () => {
  const card = planCard(idle({ plan: active, status: "running_tools", turn_mode: "executing" }), { canSend: true });
  assert.equal(card.executing, true);
  assert.equal(card.action, null);
});

test("no plan, no card; unknown task statuses count as pending", () => {
  assert.equal(planCard(idle({ plan: null })), null);
  assert.equal(planCard(null), null);
  const odd = planCard(idle({ plan: { revision: 1, status: "draft", tasks: [{ content: "x", status: "blocked" }] } }));
  assert.equal(odd.tasks[0].status, "pending");
  assert.equal(planExecutable({ status: "draft", tasks: [] }), false);
  assert.equal(planExecutable(active), true);
});

test("a question offers its choices, or a free-text answer without them", () => {
  assert.deepEqual(questionPanel({ call_id: "call_1", prompt: "Which colour?", choices: ["red", "blue"] }), {
    callId: "call_1",
    prompt: "Which colour?",
    choices: ["red", "blue"],
    freeText: false,
  });
  assert.equal(questionPanel({ call_id: "call_2", prompt: "Your name?", choices: [] }).freeText, true);
  assert.equal(questionPanel(null), null);
});

test("the timer says until when, how long is left, and why", () => {
  const now = Date.parse("2026-12-01T10:00:00Z");
  const card = timerCard({ call_id: "call_1", fires_at: "2026-12-01T10:59:58+00:00", duration_seconds: 3600, reason: "cooling off" }, now);
  assert.equal(card.left, "in 59 min 58 s");
  assert.equal(card.reason, "cooling off");
  assert.equal(card.until.toISOString(), "2026-12-01T10:59:58.000Z");
  assert.match(card.untilText, /\d\d:\d\d/);
  const later = timerCard({ call_id: "call_1", fires_at: "2026-12-03T10:00:00Z", reason: "" }, now);
  assert.equal(later.left, "in 48 h 00 min");
  assert.notEqual(later.untilText, card.untilText);
  assert.equal(timerCard({ call_id: "c", fires_at: "2026-12-01T09:00:00Z" }, now).left, "any moment now");
  assert.equal(timerCard({ call_id: "c", fires_at: "not a time" }, now), null);
  assert.equal(timerCard(null, now), null);
});

test("the status badge names a pending approval and a durable wait", () => {
  const labels = { running_tools: "Running tools", waiting_for_user_input: "Waiting for an answer" };
  assert.deepEqual(statusBadge("running_tools", { awaiting_approval: true }, labels), { key: "awaiting_approval", text: "Waiting for approval" });
  assert.deepEqual(statusBadge("running_tools", { pending_timer: { fires_at: "x" } }, labels), { key: "waiting_for_timer", text: "Waiting on a timer" });
  assert.deepEqual(statusBadge("waiting_for_user_input", {}, labels), { key: "waiting_for_user_input", text: "Waiting for an answer" });
  // A tool call waits for the answer to an MCP server's question.
  assert.deepEqual(statusBadge("running_tools", { pending_elicitations: [{ elicitation_id: "e" }] }, labels), { key: "waiting_for_user_input", text: "Waiting for an answer" });
  assert.deepEqual(statusBadge("running_tools", { pending_elicitations: [] }, labels), { key: "running_tools", text: labels.running_tools });
  assert.deepEqual(statusBadge("stopped", { awaiting_approval: true }, { stopped: "Stopped" }), { key: "stopped", text: "Stopped" });
  assert.deepEqual(statusBadge("mystery", null, labels), { key: "mystery", text: "mystery" });
});
