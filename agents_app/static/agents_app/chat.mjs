// The chat page (/sessions/<id>/): the durable conversation from the session snapshot, and
// the live Thinking / Response / Activity panels from the session's events websocket. This
// module is the page's entry: it shows every snapshot read through the page's parts, and wires
// the page's controls, refreshes and timers to them.
//
// Truth comes from the snapshot (GET /api/v1/sessions/<id>/); live events only fill the gap
// while a turn runs. The page reloads the snapshot after a turn ends (then the stored
// messages replace the live text), after approvals and tool results, when the socket
// reconnects, when the page regains focus or the network returns, and every 8 s while a turn
// runs. The socket resumes after the last token it delivered (ws_client.mjs), so across
// reconnects nothing is lost or shown twice. Which event calls for which read is
// chat_live.mjs's; every part re-reads the snapshot after its own writes.
//
// The parts, each owning its panel and the state only it uses (chat_page.mjs holds what they
// share, chat_snapshot.mjs reads the snapshot):
//   chat_conversation.mjs  the stored messages, older pages, the compaction summary
//   chat_messages.mjs      how one stored message reads
//   chat_live.mjs          the websocket: live text, Activity, Timeline, connection, deletion
//   chat_header.mjs        status, title, model, cost; rename, archive, stop, delete
//   chat_approvals.mjs     the pending approvals
//   chat_queue.mjs         the Message queue panel: edit, delete, steer
//   chat_composer.mjs      the composer: draft, Plan mode, Send, Stop generating
//   chat_plan.mjs          the plan card: Execute plan / Continue plan
//   chat_waits.mjs         the agent's question, an MCP server's question, the durable wait
// Their imports run one way (tests/agents_app/pages/test_js_modules.py): no part imports this module,
// and none imports a part that imports it back.

import { attachCounter } from "./char_limit.mjs";
import { renderApprovals, revealLinkedCall, tickApprovals } from "./chat_approvals.mjs";
import { restoreToComposer, startComposer } from "./chat_composer.mjs";
import { loadOlder, loadOlderIfVisible, mergeSnapshotMessages, renderMessages, renderSummary } from "./chat_conversation.mjs";
import { deleteThisSession, renameSession, renderHeader, stopSession, toggleArchived } from "./chat_header.mjs";
import { dropFinishedLiveText, renderAllLive, settleEndingTurns, showSessionGone, startSocket } from "./chat_live.mjs";
import { RUNNING, TURN_OPEN, followingChange, queue, showAlert, state } from "./chat_page.mjs";
import { executePlan, renderPlan } from "./chat_plan.mjs";
import { onQueueClick, renderQueue } from "./chat_queue.mjs";
import { loadSnapshot, showSnapshotsWith } from "./chat_snapshot.mjs";
import {
  answerElicitation,
  answerQuestion,
  composeInstead,
  composeInsteadOfElicitation,
  onChoiceClick,
  onElicitationClick,
  renderElicitation,
  renderQuestion,
  renderTimer,
  showComposer,
  tickWaits,
} from "./chat_waits.mjs";
import { byId, isSendShortcut } from "./dom.mjs";

const FALLBACK_REFRESH_MS = 8000;

// ---------------------------------------------------------------- snapshot

/** The turn of `snapshot` that is open (running or waiting for an answer), else null. */
function currentTurnOf(snapshot) {
  if (!TURN_OPEN.has(snapshot.status)) return null;
  if (snapshot.turn_id) return snapshot.turn_id;
  const messages = snapshot.messages ?? [];
  for (let index = messages.length - 1; index >= 0; index -= 1) {
    if (messages[index].role === "user") return messages[index].turn_id ?? null;
  }
  return null;
}

/** Show a snapshot read (chat_snapshot.mjs) in every part; the first one also starts the
 * live view. */
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
      dropFinishedLiveText();
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
  renderHeader(snapshot);
  // The failure stays in the state until a turn completes; once the next turn runs, it is
  // no longer news about "the last turn".
  const failed = snapshot.last_turn_error && !snapshot.turn_id;
  showAlert(failed ? `The last turn failed: ${snapshot.last_turn_error}` : "", "turn-failed");
  // Nothing more can happen in a stopped session: end the live view.
  if (snapshot.status === "stopped") state.socket?.stop();
  showComposer();
  byId("composer-closed").hidden = snapshot.can_send;
  if (first) startSocket(snapshot);
  loadOlderIfVisible();
  // What the page showed when it opened is not news; what changes from now on is.
  state.announcing = true;
}

// ---------------------------------------------------------------- start

showSnapshotsWith({ show: applySnapshot, gone: showSessionGone });

function refreshNow() {
  if (state.gone) return;
  loadSnapshot();
  state.socket?.reconnectNow();
}

startComposer();
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
byId("queue-list").addEventListener("click", (event) => onQueueClick(event, restoreToComposer));
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
