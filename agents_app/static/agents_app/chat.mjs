// The chat page (/sessions/<id>/): the durable conversation from the session snapshot, and
// the live Thinking / Response / Activity panels from the session's events websocket.
//
// Truth comes from the snapshot (GET /api/v1/sessions/<id>/); live events only fill the gap
// while a turn runs. The page reloads the snapshot after a turn ends (then the stored
// messages replace the live text), after approvals and tool results, when the socket
// reconnects, when the page regains focus or the network returns, and every 8 s while a turn
// runs. The socket resumes after the last token it delivered (ws_client.mjs), so across
// reconnects nothing is lost or shown twice.
//
// The Message queue panel lists steered messages, then queued ones (message_queue.mjs); the
// owner can edit, delete or steer a queued message. Edit deletes it and puts its text (and its
// Plan mode) back in the composer (PUT .../queue/<id>/ is for API clients). The panel re-reads
// GET .../queue/ on queue events (message_queued, queue_changed, steer_applied).
//
// The plan card, the question panel (request_user_input) and the timer card (durable_wait)
// show the snapshot's plan, pending_input and pending_timer (session_panels.mjs); Execute plan
// / Continue plan posts .../plan/execute/, an answer .../input/. The snapshot is re-read on
// their events (user_input_requested, user_input_answered, durable_wait_started, plan_updated,
// plan_started) and after every write.
//
// A question an MCP server asks during a running tool call (the snapshot's
// pending_elicitations, oldest first) shows in the elicitation panel (elicitation_form.mjs):
// the server's form or link, Submit (or Done), Decline and Cancel, which post
// .../elicitations/<id>/; a 400 puts the server-checked messages next to their fields. It is
// re-read on elicitation_requested and elicitation_closed.

import { ActivityLog } from "./activity.mjs";
import { announce } from "./announcer.mjs";
import { api } from "./api.mjs";
import { attachCounter, overLimitMessage } from "./char_limit.mjs";
import { RUNNING, TURN_OPEN, config, followingChange, queue, sessionPath, showAlert, state } from "./chat_page.mjs";
import { loadOlder, loadOlderIfVisible, mergeSnapshotMessages, newestSequence, renderMessages, renderSummary } from "./chat_conversation.mjs";
import { renderApprovals, revealLinkedCall, tickApprovals } from "./chat_approvals.mjs";
import { executePlan, renderPlan } from "./chat_plan.mjs";
import { answerElicitation, answerQuestion, composeInstead, composeInsteadOfElicitation, onChoiceClick, onElicitationClick, renderElicitation, renderQuestion, renderTimer, showComposer, tickWaits } from "./chat_waits.mjs";
import { cancelScheduledSnapshot, loadSnapshot, scheduleSnapshot, showSnapshotsWith } from "./chat_snapshot.mjs";
import { byId, el, isSendShortcut } from "./dom.mjs";
import { LiveText } from "./live_text.mjs";
import { renderMarkdownSoon } from "./markdown.mjs";
import { statusBadge } from "./session_panels.mjs";
import { confirmDelete, confirmWith, deleteSession, setArchived, startRename } from "./session_manage.mjs";
import { sessionsPagePath } from "./urls.mjs";
import { showSessionUsage } from "./usage_display.mjs";
import { Timeline } from "./timeline.mjs";
import { ResumableSocket, websocketUrl } from "./ws_client.mjs";

const FALLBACK_REFRESH_MS = 8000;
const TURN_END_RETRY_MS = 300;
const TURN_END_MAX_TRIES = 30;

const live = new LiveText();
const activity = new ActivityLog({ list: byId("activity-list"), empty: byId("activity-empty") });
const timeline = new Timeline({
  historyPath: `${sessionPath}history/`,
  tablist: document.querySelector(".chat-tabs"),
  panel: byId("timeline-panel"),
  toolName: (id) => state.toolNames.get(id) ?? state.snapshot?.tool_calls?.find((call) => call.tool_call_id === id)?.tool_name,
});

// ---------------------------------------------------------------- header and alerts

/** Show `status`, as the snapshot details it (a pending approval, a durable wait) unless
 * `snapshot` is null (a status hinted by live events). */
function showStatus(status, snapshot = state.snapshot) {
  state.status = status;
  const node = byId("chat-status");
  const badge = statusBadge(status, snapshot, config.statusLabels);
  if (node.textContent !== badge.text && state.announcing) announce(`Status: ${badge.text}`);
  node.textContent = badge.text;
  node.className = `status status-${badge.key}`;
  node.dataset.status = status;
  renderCancel();
  renderQueueSummary();
}

/** A turn "Stop generating" can cancel: one whose Step has committed (not ``starting``). */
const CANCELLABLE = new Set(["running_model", "running_tools", "waiting_for_user_input"]);

/** Show "Stop generating" next to Send while a turn runs (owner only: the composer is). */
function renderCancel() {
  const button = document.getElementById("composer-cancel");
  if (!button) return;
  const running = CANCELLABLE.has(state.status) && state.snapshot?.can_send !== false;
  button.hidden = !running;
  if (!running) {
    button.disabled = false;
    button.textContent = "Stop generating";
  }
}

/** Cancel the running turn (POST .../turn/cancel/): its answer so far is kept, the session
 * and its queue stay. A turn that ended meanwhile (409) just refreshes the page. */
async function cancelTurn() {
  const button = byId("composer-cancel");
  button.disabled = true;
  button.textContent = "Stopping…";
  try {
    // Naming the turn shown keeps a late click (or a cancel kept during a restart) off the next.
    const body = state.currentTurn ? { turn_id: state.currentTurn } : {};
    await api(`${sessionPath}turn/cancel/`, { method: "POST", body });
    showComposerError("");
  } catch (error) {
    button.disabled = false;
    button.textContent = "Stop generating";
    if (error.status !== 409) showComposerError(`Not stopped: ${error.message}`);
  }
  loadSnapshot();
}

/** The session was deleted (in another tab, by staff, or here): a final state. The status
 * reads "Deleted", the live panels, the composer and every control are gone, the alert says
 * so at the top, and the page stops reading the session (no repeated 404s). */
function showSessionGone() {
  if (state.gone) return;
  state.gone = true;
  state.socket?.stop();
  cancelScheduledSnapshot();
  live.clear();
  renderAllLive();
  state.status = "deleted";
  const status = byId("chat-status");
  status.textContent = "Deleted";
  status.className = "status status-stopped";
  status.dataset.status = "deleted";
  const controls = ["chat-rename", "chat-stop", "chat-archive", "chat-delete", "connection"];
  for (const id of [...controls, "composer", "composer-cancel", "composer-closed", "user-input", "elicitation", "pending-approvals", "timer"]) {
    const node = document.getElementById(id);
    if (node) node.hidden = true;
  }
  showAlert("This session no longer exists.", "gone");
  announce("This session no longer exists.");
  // The header (its "Deleted" status) and the alert under it, not under the sticky bar.
  window.scrollTo({ top: 0, behavior: "instant" });
}

const CONNECTION_TEXT = {
  connecting: "Connecting…",
  open: "Live",
  stopped: "",
};

function showConnection(socketState, detail = {}) {
  const node = byId("connection");
  let text = CONNECTION_TEXT[socketState] ?? socketState;
  if (socketState === "connecting" && detail.reconnect) text = "Reconnecting…";
  if (socketState === "waiting") {
    text = navigator.onLine === false ? "Offline; live updates resume when the network returns" : `Live updates interrupted; retrying in ${Math.ceil((detail.delay ?? 0) / 1000)} s`;
  }
  if (socketState === "offline") text = "Offline; live updates resume when the network returns";
  if (socketState === "refused" && detail.code === 4404) showSessionGone();
  if (state.gone) {
    // The alert says why nothing is live any more.
    byId("dock-connection").hidden = true;
    return;
  }
  if (socketState === "refused") {
    text = detail.code === 4401 ? "Live updates refused: log in again" : "Live updates are not available for this session";
  }
  node.dataset.state = { waiting: "reconnecting", offline: "closed", refused: "closed" }[socketState] ?? socketState;
  node.textContent = text;
  const trouble = ["waiting", "offline", "refused"].includes(socketState);
  const dock = byId("dock-connection");
  dock.textContent = trouble ? text : "";
  dock.hidden = !trouble;
}

function showComposerError(text) {
  const node = document.getElementById("composer-error");
  if (!node) return;
  node.textContent = text;
  node.hidden = !text;
}

// ---------------------------------------------------------------- live text

function renderLive(kind) {
  const panel = byId(kind);
  const container = byId(`${kind}-groups`);
  const groups = live.list(kind);
  const keep = new Set(groups.map((group) => group.key));
  for (const node of [...container.children]) {
    if (!keep.has(node.dataset.key)) node.remove();
  }
  for (const group of groups) {
    let node = [...container.children].find((child) => child.dataset.key === group.key);
    if (!node) {
      node = el(kind === "response" ? "div" : "p", { class: "live-text", dataset: { key: group.key, turn: group.turnId ?? "" } });
      container.append(node);
    }
    // The Response is Markdown, parsed again at most once per frame as it grows.
    if (kind === "response") renderMarkdownSoon(node, group.text);
    else if (node.textContent !== group.text) node.textContent = group.text;
    node.dataset.attempt = String(group.attempt);
  }
  panel.hidden = groups.every((group) => !group.text);
}

function renderAllLive() {
  renderLive("response");
  renderLive("thinking");
}

// ---------------------------------------------------------------- queue

const QUEUE_ACTIONS = [
  { action: "edit", label: "Edit", name: "Edit queued message" },
  { action: "delete", label: "Delete", name: "Delete queued message" },
  { action: "steer", label: "Steer", name: "Steer queued message" },
];

function canChangeQueue() {
  return Boolean(state.snapshot?.can_send ?? config.canSend);
}

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
  if (row.kind === "queued" && canChangeQueue()) {
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
function renderQueue() {
  const list = byId("queue-list");
  const rows = queue.rows();
  const keys = new Set(rows.map((row) => row.key));
  for (const [key, node] of state.queueNodes) {
    if (!keys.has(key)) {
      node.remove();
      state.queueNodes.delete(key);
    }
  }
  rows.forEach((row, index) => {
    let node = state.queueNodes.get(row.key);
    const actionable = row.kind === "queued" && canChangeQueue();
    const stale =
      node && ((node.querySelector(".queue-actions") !== null) !== actionable || node.dataset.held !== (row.heldReason ?? ""));
    const relabel = node && row.kind === "sending" && row.confirmed && node.dataset.confirmed !== "true";
    if (!node || stale || relabel) {
      const fresh = queueRowNode(row);
      if (row.kind === "sending" && row.confirmed) fresh.dataset.confirmed = "true";
      if (node) node.replaceWith(fresh);
      node = fresh;
      state.queueNodes.set(row.key, node);
    }
    // Move only what is out of place: moving a node would take focus from its button.
    if (list.children[index] !== node) list.insertBefore(node, list.children[index] ?? null);
    for (const button of node.querySelectorAll(".queue-action")) button.disabled = state.queueBusy;
  });
  const panel = byId("queue");
  panel.dataset.count = String(queue.count);
  panel.setAttribute("aria-busy", String(state.queueBusy));
  renderQueueSummary();
  restoreQueueFocus();
  // Execute plan waits for an empty queue.
  renderPlan();
}

/** The queue's summary line: "for the current turn" only while one runs. */
function renderQueueSummary() {
  const node = document.getElementById("queue-summary");
  if (node) node.textContent = queue.summary({ turnRunning: TURN_OPEN.has(state.status) });
}

/** After a delete or steer, focus the same button of the row that took the old one's place,
 * else the composer, so keyboard users keep their place. */
function restoreQueueFocus() {
  const focus = state.queueFocus;
  if (!focus || state.queueBusy) return;
  state.queueFocus = null;
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
function loadQueue() {
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

/** Delete, edit or steer the queued message `id`; queue buttons are disabled meanwhile. */
async function changeQueued(action, id, text, planMode = false) {
  if (state.queueBusy) return;
  const rows = [...byId("queue-list").querySelectorAll('[data-kind="queued"]')];
  const index = rows.findIndex((node) => node.dataset.id === id);
  state.queueBusy = true;
  // Disabled buttons lose focus: it comes back to the row that takes this one's place.
  state.queueFocus = { action, index: Math.max(index, 0) };
  showQueueError("");
  renderQueue();
  const path = `${sessionPath}queue/${encodeURIComponent(id)}/`;
  try {
    if (action === "steer") await api(`${path}steer/`, { method: "POST" });
    else await api(path, { method: "DELETE" });
    if (action === "edit") {
      state.queueFocus = null;
      restoreToComposer(text, planMode);
    }
  } catch (error) {
    showQueueError(error.status === 404 ? GONE_TEXT[action] : `Not done: ${error.message}`);
  }
  // Stay busy until the queue shows the change, so the old row cannot be clicked again.
  try {
    await loadQueue();
  } finally {
    state.queueBusy = false;
    renderQueue();
  }
  if (action === "steer") scheduleSnapshot();
}

/** Put an edited message's text in the composer (after any draft already there), with its Plan
 * mode, and focus it. */
function restoreToComposer(text, planMode = false) {
  const box = document.getElementById("composer-text");
  if (!box) return;
  if (planMode) setPlanMode(true);
  box.value = box.value.trim() ? `${box.value.replace(/\s+$/, "")}\n${text}` : text;
  saveDraft();
  box.focus();
  box.setSelectionRange(box.value.length, box.value.length);
}

function onQueueClick(event) {
  const button = event.target.closest(".queue-action");
  if (!button || button.disabled) return;
  const item = button.closest('[data-kind="queued"]');
  if (!item) return;
  changeQueued(
    button.dataset.action,
    item.dataset.id,
    item.querySelector(".queue-text")?.textContent ?? "",
    item.dataset.planMode === "true",
  );
}

// ---------------------------------------------------------------- snapshot

function currentTurnOf(snapshot) {
  if (!TURN_OPEN.has(snapshot.status)) return null;
  if (snapshot.turn_id) return snapshot.turn_id;
  const messages = snapshot.messages ?? [];
  for (let index = messages.length - 1; index >= 0; index -= 1) {
    if (messages[index].role === "user") return messages[index].turn_id ?? null;
  }
  return null;
}

function settleEndingTurns(snapshot) {
  const newest = newestSequence();
  let retry = false;
  for (const [turnId, ending] of state.ending) {
    const stored =
      ending.messageCount !== null && ending.messageCount !== undefined
        ? newest >= ending.messageCount
        : !RUNNING.has(snapshot.status) || state.currentTurn !== turnId;
    if (stored || ending.tries >= TURN_END_MAX_TRIES) {
      live.dropTurn(turnId);
      state.completedTurns.add(turnId);
      state.ending.delete(turnId);
    } else {
      ending.tries += 1;
      retry = true;
    }
  }
  // The engine may announce the end of a turn a moment before its messages are readable.
  if (retry) setTimeout(loadSnapshot, TURN_END_RETRY_MS);
}

function applySnapshot(snapshot, queueRead, snapshotRead) {
  const first = state.snapshot === null;
  state.snapshot = snapshot;
  state.currentTurn = currentTurnOf(snapshot);
  for (const message of snapshot.messages ?? []) {
    if (message.turn_id && message.turn_id !== state.currentTurn) state.completedTurns.add(message.turn_id);
  }
  queue.apply(queueRead, { queued: snapshot.queued_messages, steered: snapshot.steered_messages });
  followingChange(
    () => {
      mergeSnapshotMessages(snapshot.messages ?? []);
      live.dropWhere((group) => state.completedTurns.has(group.turnId));
      settleEndingTurns(snapshot);
      renderMessages();
      renderAllLive();
      renderApprovals(snapshot.pending_interrupts ?? []);
      renderQueue();
      renderPlan(snapshotRead);
      renderTimer();
      renderSummary(snapshot.summary);
      renderQuestion();
      renderElicitation();
    },
    { force: first },
  );
  revealLinkedCall();
  showStatus(snapshot.status, snapshot);
  if (snapshot.model) byId("chat-model").textContent = snapshot.model;
  showTitle(snapshot.title);
  showSessionUsage(byId("chat-cost"), snapshot.usage);
  // The failure stays in the state until a turn completes; once the next turn runs, it is
  // no longer news about "the last turn".
  const failed = snapshot.last_turn_error && !snapshot.turn_id;
  showAlert(failed ? `The last turn failed: ${snapshot.last_turn_error}` : "", "turn-failed");
  byId("chat-stop").hidden = snapshot.status === "stopped" || !(config.isOwner || config.canApprove);
  // Nothing more can happen in a stopped session: end the live view.
  if (snapshot.status === "stopped") state.socket?.stop();
  showComposer();
  byId("composer-closed").hidden = snapshot.can_send;
  if (first) startSocket(snapshot);
  loadOlderIfVisible();
  // What the page showed when it opened is not news; what changes from now on is.
  state.announcing = true;
}

// ---------------------------------------------------------------- events

/**
 * Show a status the events imply until the next snapshot says for sure; a pending approval
 * (known only from the snapshot) is not overridden by replayed events.
 */
function hintStatus(status) {
  if (state.snapshot?.awaiting_approval || state.status === "stopped") return;
  if (state.status !== status) showStatus(status, null);
}

function onEvent(frame) {
  const event = frame.event;
  if (state.gone || !event || typeof event.type !== "string") return;
  timeline.onEvent(event);
  // Replays of turns whose messages are already stored add nothing.
  if (event.turn_id && state.completedTurns.has(event.turn_id)) return;
  activity.note(event);
  const group = live.apply(event);
  if (group) {
    if (group.kind === "response" && event.turn_id && !state.writingTurns.has(event.turn_id)) {
      state.writingTurns.add(event.turn_id);
      announce("The assistant is writing an answer…");
    }
    hintStatus("running_model");
    followingChange(() => renderLive(group.kind));
    return;
  }
  activity.add(event);
  switch (event.type) {
    case "turn_started":
      if (event.turn_id !== state.currentTurn) hintStatus("running_model");
      if (byId("chat-alert").dataset.kind === "turn-failed") showAlert("");
      scheduleSnapshot();
      break;
    case "tool_call_started":
      hintStatus("running_tools");
      break;
    case "turn_completed":
    case "turn_cancelled":
      state.ending.set(event.turn_id, { messageCount: event.data?.message_count ?? null, tries: 0 });
      loadSnapshot();
      break;
    case "turn_failed":
      state.ending.set(event.turn_id, { messageCount: null, tries: 0 });
      loadSnapshot();
      break;
    case "tool_call_deferred":
    case "tool_call_finished":
    case "interrupt_raised":
    case "interrupt_resolved":
      scheduleSnapshot();
      break;
    case "message_queued":
    case "queue_changed":
      loadQueue();
      break;
    case "steer_applied":
      // Withdrawn approvals and cancelled calls show in the snapshot.
      loadQueue();
      scheduleSnapshot();
      break;
    case "session_stopped":
      // session_delete stops the Flow with this reason before the socket closes with 4404.
      if (event.data?.reason === "deleted by user") showSessionGone();
      else loadSnapshot();
      break;
    case "usage_recorded":
      showSessionUsage(byId("chat-cost"), event.data?.session);
      break;
    case "user_input_requested":
      hintStatus("waiting_for_user_input");
      scheduleSnapshot();
      break;
    case "elicitation_requested":
    case "elicitation_closed":
    case "user_input_answered":
    case "durable_wait_started":
    case "plan_updated":
    case "plan_started":
    case "context_compacted":
      scheduleSnapshot();
      break;
    default:
      break;
  }
}

function startSocket(snapshot) {
  // While a turn runs, start before its first event so its text so far shows up (the
  // server's live_events_after); without it, from the oldest retained event. Replayed events
  // of finished turns are dropped by onEvent.
  const after = snapshot.live_events_after ?? (RUNNING.has(snapshot.status) ? "" : snapshot.events_after ?? "");
  state.socket = new ResumableSocket({
    url: websocketUrl(`/ws/sessions/${encodeURIComponent(config.session)}/events/`),
    after,
    onEvent,
    onSnapshotRequired: () => loadSnapshot(),
    onOpen: ({ reconnected }) => {
      if (reconnected) loadSnapshot();
    },
    onStateChange: showConnection,
  });
  state.socket.start();
}

// ---------------------------------------------------------------- composer

/** Turn the composer's Plan mode on or off; the Send button says what will happen. */
function setPlanMode(on) {
  const toggle = document.getElementById("composer-plan");
  if (!toggle) return;
  toggle.checked = on;
  byId("composer-send").textContent = on ? "Create plan" : "Send";
  byId("composer-plan-hint").hidden = !on;
}

// The composer's text is kept in this tab's sessionStorage, so a reload (or an Edit that took
// a message out of the queue) loses nothing that was typed.
const draftKey = `dexagents:draft:${config.session}`;
/** Updates the composer's character counter (`char_limit.mjs`); null without a composer. */
let composerCounter = null;

function saveDraft() {
  const box = document.getElementById("composer-text");
  if (!box) return;
  // Every change of the box's text that is not typing (a restored draft, an edited queued
  // message, a send) comes through here; typing updates the counter by itself.
  composerCounter?.();
  try {
    if (box.value) sessionStorage.setItem(draftKey, box.value);
    else sessionStorage.removeItem(draftKey);
  } catch {
    // Storage may be off or full: the draft is then only in the box.
  }
}

function restoreDraft() {
  const box = document.getElementById("composer-text");
  if (!box || box.value) return;
  try {
    box.value = sessionStorage.getItem(draftKey) ?? "";
  } catch {
    // No storage: nothing to restore.
  }
}

/** The POST of the message sent last: each send waits for it, so messages sent in quick
 * succession reach the server (and the queue) in the order they were sent. */
let previousSend = Promise.resolve();
/** When the last message was sent (performance.now() ms): the second click of a double-click
 * on Send finds the box emptied by the first and is ignored, not refused. */
let lastSendAt = -Infinity;
const DOUBLE_CLICK_MS = 800;

async function send(event) {
  event.preventDefault();
  const text = byId("composer-text");
  const value = text.value;
  if (!value.trim() && performance.now() - lastSendAt < DOUBLE_CLICK_MS) return;
  if (!value.trim()) {
    showComposerError("Write a message first.");
    text.focus();
    return;
  }
  const refusal = overLimitMessage(text);
  if (refusal) {
    showComposerError(refusal);
    text.focus();
    return;
  }
  showComposerError("");
  const planMode = byId("composer-plan").checked;
  const sending = queue.addSending(value, { planMode });
  lastSendAt = performance.now();
  text.value = "";
  saveDraft();
  // Plan mode is per message.
  setPlanMode(false);
  followingChange(() => renderQueue(), { force: true });
  renderPlan();
  try {
    const posting = previousSend.then(() =>
      api(`${sessionPath}messages/`, { method: "POST", body: { text: value, plan_mode: planMode } }));
    previousSend = posting.catch(() => undefined);
    const answer = await posting;
    queue.confirmSending(sending, answer?.id ?? null);
    renderQueue();
    showAlert("");
  } catch (error) {
    queue.dropSending(sending);
    renderQueue();
    if (!text.value) {
      text.value = value;
      setPlanMode(planMode);
      saveDraft();
    }
    showComposerError(`Not sent: ${error.message} Your text is still in the box.`);
  }
  renderPlan();
  loadSnapshot();
}

/** Stop the session (owner or staff) after the user confirms; the Flow stops for good. */
async function stopSession() {
  if (!(await confirmWith(byId("stop-dialog"), "stop"))) return;
  const button = byId("chat-stop");
  button.disabled = true;
  try {
    await api(`${sessionPath}stop/`, { method: "POST" });
    showAlert("");
  } catch (error) {
    showAlert(`Not stopped: ${error.message}`);
  } finally {
    button.disabled = false;
  }
  loadSnapshot();
}

/** Show `title` in the heading and the tab's title (a rename here, or one another tab or
 * client made, which the next snapshot read brings: on focus, on any event). */
function showTitle(title) {
  const heading = byId("chat-title");
  if (!title || heading.textContent === title) return;
  heading.textContent = title;
  // "<title> · dexagents", with "(n) " before it when approvals wait (approvals.mjs).
  const [, count = ""] = /^(\(\d+\) )?/.exec(document.title);
  const site = document.title.slice(document.title.lastIndexOf(" · "));
  document.title = `${count}${title}${site}`;
}

/** Rename in place: the heading becomes a text box (owner only). */
function renameSession() {
  const heading = byId("chat-title");
  const button = byId("chat-rename");
  button.hidden = true;
  startRename({
    target: heading,
    sessionId: config.session,
    title: heading.textContent,
    onRenamed: (title) => {
      showTitle(title);
      announce(`Renamed to ${title}.`);
    },
    onClosed: () => {
      button.hidden = false;
      button.focus();
    },
  });
}

/** Archive or bring back the session (owner only); it stays usable either way. */
async function toggleArchived() {
  const button = byId("chat-archive");
  const archived = button.dataset.archived !== "true";
  button.disabled = true;
  try {
    const session = await setArchived(config.session, archived);
    button.dataset.archived = String(session.archived);
    button.textContent = session.archived ? "Unarchive" : "Archive";
    byId("chat-archived").hidden = !session.archived;
    announce(session.archived ? "Session archived." : "Session no longer archived.");
    showAlert("");
  } catch (error) {
    showAlert(`Not changed: ${error.message}`);
  } finally {
    button.disabled = false;
  }
}

/** Delete the session after the dialog's confirmation, then go to the sessions list. */
async function deleteThisSession() {
  if (!(await confirmDelete(byId("delete-dialog")))) return;
  const button = byId("chat-delete");
  button.disabled = true;
  try {
    state.socket?.pause();
    await deleteSession(config.session);
    window.location.assign(sessionsPagePath);
  } catch (error) {
    showAlert(`Not deleted: ${error.message}`);
    button.disabled = false;
    state.socket?.reconnectNow();
  }
}

// ---------------------------------------------------------------- start

showSnapshotsWith({ show: applySnapshot, gone: showSessionGone });

function refreshNow() {
  if (state.gone) return;
  loadSnapshot();
  state.socket?.reconnectNow();
}

const composer = document.getElementById("composer");
if (composer) {
  composer.addEventListener("submit", send);
  composerCounter = attachCounter(byId("composer-text"), { after: byId("composer-send").closest(".composer-actions") ?? byId("composer-send"), submit: byId("composer-send") });
  restoreDraft();
  composerCounter?.();
  byId("composer-text").addEventListener("input", saveDraft);
  byId("composer-text").addEventListener("keydown", (event) => {
    if (isSendShortcut(event)) {
      event.preventDefault();
      composer.requestSubmit();
    }
  });
  byId("composer-plan").addEventListener("change", (event) => setPlanMode(event.target.checked));
  byId("composer-cancel").addEventListener("click", cancelTurn);
  setPlanMode(byId("composer-plan").checked);
}
const answerForm = document.getElementById("user-input-form");
if (answerForm) {
  attachCounter(byId("user-input-text"), { after: byId("user-input-submit"), submit: byId("user-input-submit") });
  answerForm.addEventListener("submit", (event) => {
    event.preventDefault();
    answerQuestion(byId("user-input-text").value);
  });
  byId("user-input-text").addEventListener("keydown", (event) => {
    if (isSendShortcut(event)) {
      event.preventDefault();
      answerForm.requestSubmit();
    }
  });
  byId("user-input-choices").addEventListener("click", onChoiceClick);
  byId("user-input-compose").addEventListener("click", composeInstead);
}
const elicitationForm = document.getElementById("elicitation-form");
if (elicitationForm) {
  elicitationForm.addEventListener("submit", (event) => {
    event.preventDefault();
    answerElicitation("accept");
  });
  elicitationForm.addEventListener("click", onElicitationClick);
  byId("elicitation-compose").addEventListener("click", composeInsteadOfElicitation);
}
byId("plan-execute").addEventListener("click", executePlan);
byId("load-older").addEventListener("click", loadOlder);
byId("queue-list").addEventListener("click", onQueueClick);
byId("chat-stop").addEventListener("click", stopSession);
document.getElementById("chat-rename")?.addEventListener("click", renameSession);
document.getElementById("chat-archive")?.addEventListener("click", toggleArchived);
document.getElementById("chat-delete")?.addEventListener("click", deleteThisSession);
if ("IntersectionObserver" in window) {
  new IntersectionObserver((entries) => {
    if (entries.some((entry) => entry.isIntersecting) && state.snapshot) loadOlder();
  }).observe(byId("older-sentinel"));
}
window.addEventListener("focus", refreshNow);
window.addEventListener("online", refreshNow);
// An established socket may outlive a lost network without noticing; resume it afresh.
window.addEventListener("offline", () => state.socket?.pause());
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") refreshNow();
});
setInterval(() => {
  if (document.visibilityState !== "visible") return;
  const busy = RUNNING.has(state.status) || state.snapshot?.awaiting_approval || state.socket?.state !== "open";
  if (busy) loadSnapshot();
}, FALLBACK_REFRESH_MS);
setInterval(() => {
  tickWaits();
  tickApprovals();
}, 1000);

loadSnapshot();
