// The chat page's composer (owner only): the message box with its character counter and the
// draft kept in this tab's sessionStorage, Plan mode, Send (POST .../messages/, in the order
// sent; the message shows in the queue as "sending" at once, and a refusal puts the text back)
// and Stop generating (POST .../turn/cancel/) while a turn runs. An edited queued message comes
// back here (restoreToComposer).

import { api } from "./api.mjs";
import { attachCounter, overLimitMessage } from "./char_limit.mjs";
import { config, followingChange, queue, sessionPath, showAlert, state } from "./chat_page.mjs";
import { renderPlan } from "./chat_plan.mjs";
import { renderQueue } from "./chat_queue.mjs";
import { loadSnapshot } from "./chat_snapshot.mjs";
import { byId, isSendShortcut } from "./dom.mjs";

/** A turn "Stop generating" can cancel: one whose Step has committed (not ``starting``). */
const CANCELLABLE = new Set(["running_model", "running_tools", "waiting_for_user_input"]);

/** Show "Stop generating" next to Send while a turn runs (owner only: the composer is). */
export function renderCancel() {
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

/** Show `text` under the composer (none when empty). */
function showComposerError(text) {
  const node = document.getElementById("composer-error");
  if (!node) return;
  node.textContent = text;
  node.hidden = !text;
}

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

/** Put an edited message's text in the composer (after any draft already there), with its Plan
 * mode, and focus it. */
export function restoreToComposer(text, planMode = false) {
  const box = document.getElementById("composer-text");
  if (!box) return;
  if (planMode) setPlanMode(true);
  box.value = box.value.trim() ? `${box.value.replace(/\s+$/, "")}\n${text}` : text;
  saveDraft();
  box.focus();
  box.setSelectionRange(box.value.length, box.value.length);
}

/** Wire the composer (none for readers who are not the owner): Send and its shortcut, the
 * character counter, the draft, Plan mode and Stop generating. */
export function startComposer() {
  const composer = document.getElementById("composer");
  if (!composer) return;
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
