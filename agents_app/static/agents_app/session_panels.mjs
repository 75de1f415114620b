// What the chat page's status badge, plan card, question panel and timer card show for a
// session snapshot, without the DOM. The chat page's parts render it (chat_header.mjs,
// chat_plan.mjs, chat_waits.mjs); tests/agents_app/pages/js/session_panels.test.mjs tests it.

import { clockTime, dateTime, duration } from "./dom.mjs";

export const TASK_MARKS = { completed: "✓", in_progress: "●", pending: "○" };
export const TASK_STATUS_TEXT = { completed: "Completed", in_progress: "In progress", pending: "Pending" };
const PLAN_STATUS_TEXT = { draft: "Draft", active: "Active", completed: "Completed" };

/**
 * The header badge: `{key, text}`, where `key` names the CSS class (`status-<key>`). A pending
 * approval, a question of an MCP server and a running durable wait say more than the status
 * alone ("Running tools").
 */
export function statusBadge(status, snapshot, labels = {}) {
  if (status !== "stopped" && snapshot?.awaiting_approval) return { key: "awaiting_approval", text: "Waiting for approval" };
  if (status === "running_tools" && snapshot?.pending_elicitations?.length) {
    return { key: "waiting_for_user_input", text: labels.waiting_for_user_input ?? "Waiting for an answer" };
  }
  if (status === "running_tools" && snapshot?.pending_timer) return { key: "waiting_for_timer", text: "Waiting on a timer" };
  return { key: status, text: labels[status] ?? status };
}

/** Whether `plan` can be executed: a draft with tasks, or an active plan with a task left. */
export function planExecutable(plan) {
  const tasks = Array.isArray(plan?.tasks) ? plan.tasks : [];
  if (!tasks.length) return false;
  if (plan.status === "draft") return true;
  return plan.status === "active" && tasks.some((task) => task.status !== "completed");
}

/**
 * The plan card, or null when the session has no plan.
 *
 * `action` (`{label, revision}`: "Execute plan" for a draft, "Continue plan" for an active plan
 * with unfinished tasks) is offered only when POST .../plan/execute/ would accept it: the viewer
 * may write (`canSend`), the session waits for a message, no question is open, nothing is
 * queued, steered or being sent (`waiting`, the queue panel's count), and no execution is
 * already requested (by the snapshot, or by this page: `requested`).
 */
export function planCard(snapshot, { canSend = false, waiting = 0, requested = false } = {}) {
  const plan = snapshot?.plan;
  if (!plan) return null;
  const tasks = (Array.isArray(plan.tasks) ? plan.tasks : []).map((task) => {
    const status = TASK_MARKS[task.status] ? task.status : "pending";
    return { content: task.content ?? "", status, mark: TASK_MARKS[status], statusText: TASK_STATUS_TEXT[status] };
  });
  const done = tasks.filter((task) => task.status === "completed").length;
  const isRequested = Boolean(snapshot.plan_execution_requested || requested);
  const free =
    snapshot.status === "waiting_for_user_message" &&
    !snapshot.pending_input &&
    !(snapshot.queued_messages ?? []).length &&
    !(snapshot.steered_messages ?? []).length &&
    waiting === 0;
  let action = null;
  if (canSend && free && !isRequested && planExecutable(plan)) {
    action = { label: plan.status === "draft" ? "Execute plan" : "Continue plan", revision: plan.revision };
  }
  return {
    revision: plan.revision,
    status: plan.status,
    statusText: PLAN_STATUS_TEXT[plan.status] ?? plan.status,
    tasks,
    done,
    total: tasks.length,
    progress: `${done}/${tasks.length} completed`,
    executing: snapshot.turn_mode === "executing" && snapshot.status !== "waiting_for_user_message" && snapshot.status !== "stopped",
    requested: isRequested && plan.status !== "completed",
    action,
  };
}

/** The open question: `{callId, prompt, choices, freeText}`, or null. */
export function questionPanel(pending) {
  if (!pending || !pending.call_id) return null;
  const choices = Array.isArray(pending.choices) ? pending.choices.map(String) : [];
  return { callId: String(pending.call_id), prompt: pending.prompt ?? "", choices, freeText: choices.length === 0 };
}

/**
 * The timer card: `{callId, until (Date), untilText, left, reason}`, or null without a valid
 * timer. `untilText` is the time of day, with the date when it is not today; `left` is
 * "in 59 min 58 s", or "any moment now" once `fires_at` has passed (the worker fires it).
 */
export function timerCard(timer, now = Date.now()) {
  if (!timer) return null;
  const until = new Date(timer.fires_at);
  if (Number.isNaN(until.getTime())) return null;
  const sameDay = new Date(now).toDateString() === until.toDateString();
  const left = until.getTime() - now;
  return {
    callId: String(timer.call_id ?? ""),
    until,
    untilText: sameDay ? clockTime(until) : dateTime(until),
    left: left > 0 ? `in ${duration(left)}` : "any moment now",
    reason: timer.reason ?? "",
  };
}
