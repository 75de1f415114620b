// The chat page's Message queue panel: steered messages, then queued ones, then messages this
// page is sending (message_queue.mjs orders them and words the summary), each row keyed so a
// focused button keeps its focus. The owner may edit, delete or steer a queued message (Edit
// deletes it and hands its text and Plan mode back to the composer; PUT .../queue/<id>/ is for
// API clients); the buttons wait while one change is in flight, and focus then goes to the row
// that took the changed one's place. GET .../queue/ is re-read, one read at a time, on the
// queue's events (message_queued, queue_changed, steer_applied: chat_live.mjs).

import { api } from "./api.mjs";
import { TURN_OPEN, ownerCanSend, queue, sessionPath, state } from "./chat_page.mjs";
import { renderPlan } from "./chat_plan.mjs";
import { scheduleSnapshot } from "./chat_snapshot.mjs";
import { byId, el } from "./dom.mjs";

const panel = {
  nodes: new Map(), // row key -> <li>
  busy: false, // a delete, edit or steer is in flight
  focus: null, // {action, index}: where focus goes once the queue is shown again
};

const QUEUE_ACTIONS = [
  { action: "edit", label: "Edit", name: "Edit queued message" },
  { action: "delete", label: "Delete", name: "Delete queued message" },
  { action: "steer", label: "Steer", name: "Steer queued message" },
];

function queueBadge(row) {
  if (row.kind === "steered") return el("span", { class: "badge badge-steering" }, "Steering");
  if (row.kind === "sending" && !row.confirmed) return el("span", { class: "badge" }, "Sending…");
  if (row.heldReason) return el("span", { class: "badge badge-held" }, "Held: budget spent");
  if (row.delivery === "pending") return el("span", { class: "badge", title: "Kept until the worker answers" }, "Queued, not delivered");
  return el("span", { class: "badge" }, "Queued");
}

function queueRowNode(row) {
  const node = el(
    "li",
    { class: "queue-item", dataset: { key: row.key, kind: row.kind, id: row.id, planMode: String(row.planMode) } },
    queueBadge(row),
    row.planMode ? el("span", { class: "badge badge-plan" }, "Plan mode") : null,
    el("span", { class: "queue-text" }, row.text),
  );
  node.dataset.held = row.heldReason ?? "";
  if (row.kind === "queued" && ownerCanSend()) {
    node.append(
      el(
        "span",
        { class: "queue-actions" },
        // A held message cannot be steered: no turn takes it before the budget allows it.
        QUEUE_ACTIONS.filter(({ action }) => !(row.heldReason && action === "steer")).map(({ action, label, name }) =>
          el("button", { type: "button", class: "button-quiet queue-action", "aria-label": name, dataset: { action } }, label),
        ),
      ),
    );
  }
  if (row.heldReason) node.append(el("p", { class: "queue-held small" }, row.heldReason));
  return node;
}

/** Show `queue`: keyed rows (a row keeps its node, and a focused button its focus). */
export function renderQueue() {
  const list = byId("queue-list");
  const rows = queue.rows();
  const keys = new Set(rows.map((row) => row.key));
  for (const [key, node] of panel.nodes) {
    if (!keys.has(key)) {
      node.remove();
      panel.nodes.delete(key);
    }
  }
  rows.forEach((row, index) => {
    let node = panel.nodes.get(row.key);
    const actionable = row.kind === "queued" && ownerCanSend();
    const stale =
      node && ((node.querySelector(".queue-actions") !== null) !== actionable || node.dataset.held !== (row.heldReason ?? ""));
    const relabel = node && row.kind === "sending" && row.confirmed && node.dataset.confirmed !== "true";
    if (!node || stale || relabel) {
      const fresh = queueRowNode(row);
      if (row.kind === "sending" && row.confirmed) fresh.dataset.confirmed = "true";
      if (node) node.replaceWith(fresh);
      node = fresh;
      panel.nodes.set(row.key, node);
    }
    // Move only what is out of place: moving a node would take focus from its button.
    if (list.children[index] !== node) list.insertBefore(node, list.children[index] ?? null);
    for (const button of node.querySelectorAll(".queue-action")) button.disabled = panel.busy;
  });
  const box = byId("queue");
  box.dataset.count = String(queue.count);
  box.setAttribute("aria-busy", String(panel.busy));
  renderQueueSummary();
  restoreQueueFocus();
  // Execute plan waits for an empty queue.
  renderPlan();
}

/** The queue's summary line: "for the current turn" only while one runs. */
export function renderQueueSummary() {
  const node = document.getElementById("queue-summary");
  if (node) node.textContent = queue.summary({ turnRunning: TURN_OPEN.has(state.status) });
}

/** After a delete or steer, focus the same button of the row that took the old one's place,
 * else the composer, so keyboard users keep their place. */
function restoreQueueFocus() {
  const focus = panel.focus;
  if (!focus || panel.busy) return;
  panel.focus = null;
  const rows = [...byId("queue-list").querySelectorAll('[data-kind="queued"]')];
  const row = rows[Math.min(focus.index, rows.length - 1)];
  const target = row?.querySelector(`[data-action="${focus.action}"]`) ?? document.getElementById("composer-text");
  target?.focus();
}

function showQueueError(text) {
  const node = byId("queue-error");
  node.textContent = text;
  node.hidden = !text;
}

let queueLoading = null;
let queueAgain = false;

/**
 * Re-read GET .../queue/: one read at a time; a request during a read runs one more read after
 * it, and every caller's promise settles once the reads it asked for are shown.
 */
export function loadQueue() {
  if (state.gone) return undefined;
  if (queueLoading) {
    queueAgain = true;
    return queueLoading;
  }
  queueLoading = (async () => {
    do {
      queueAgain = false;
      const read = queue.startRead();
      try {
        const answer = await api(`${sessionPath}queue/`);
        if (queue.apply(read, answer ?? {})) renderQueue();
      } catch (error) {
        // The snapshot carries the queue too; fall back to it.
        if (error.status !== 0) scheduleSnapshot();
      }
    } while (queueAgain);
    queueLoading = null;
  })();
  return queueLoading;
}

const GONE_TEXT = {
  edit: "That message can no longer be edited: the agent already took it.",
  delete: "That message can no longer be deleted: the agent already took it.",
  steer: "That message can no longer be steered: the agent already took it.",
};

/** Delete, edit or steer the queued message `id`; queue buttons are disabled meanwhile. An
 * edited message's `text` and `planMode` go to `restore` once it is deleted. */
async function changeQueued(action, id, text, planMode, restore) {
  if (panel.busy) return;
  const rows = [...byId("queue-list").querySelectorAll('[data-kind="queued"]')];
  const index = rows.findIndex((node) => node.dataset.id === id);
  panel.busy = true;
  // Disabled buttons lose focus: it comes back to the row that takes this one's place.
  panel.focus = { action, index: Math.max(index, 0) };
  showQueueError("");
  renderQueue();
  const path = `${sessionPath}queue/${encodeURIComponent(id)}/`;
  try {
    if (action === "steer") await api(`${path}steer/`, { method: "POST" });
    else await api(path, { method: "DELETE" });
    if (action === "edit") {
      panel.focus = null;
      restore(text, planMode);
    }
  } catch (error) {
    showQueueError(error.status === 404 ? GONE_TEXT[action] : `Not done: ${error.message}`);
  }
  // Stay busy until the queue shows the change, so the old row cannot be clicked again.
  try {
    await loadQueue();
  } finally {
    panel.busy = false;
    renderQueue();
  }
  if (action === "steer") scheduleSnapshot();
}

/** The queue list's clicks: a queued row's Edit, Delete or Steer. Edit puts the message back
 * with `restore(text, planMode)` (the composer's). */
export function onQueueClick(event, restore) {
  const button = event.target.closest(".queue-action");
  if (!button || button.disabled) return;
  const item = button.closest('[data-kind="queued"]');
  if (!item) return;
  changeQueued(
    button.dataset.action,
    item.dataset.id,
    item.querySelector(".queue-text")?.textContent ?? "",
    item.dataset.planMode === "true",
    restore,
  );
}

