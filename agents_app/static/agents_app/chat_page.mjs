// What the chat page's parts (chat.mjs and the chat_*.mjs modules it wires) share: the page's
// configuration from its template, the session's API path, the state more than one part reads
// or writes, the message queue's model, the page alert, and following the newest content while
// the reader is at the bottom. It imports no other part of the page; every part may import it.
// State that one part alone uses lives in that part.

import { byId, pageConfig } from "./dom.mjs";
import { MessageQueue } from "./message_queue.mjs";
import { sessionApiPath } from "./urls.mjs";

/** The template's client_config (session, status, owner, isOwner, canSend, canApprove, ...). */
export const config = pageConfig("chat-config");
/** The session's REST path, "/api/v1/sessions/<id>/" (urls.mjs). */
export const sessionPath = sessionApiPath(config.session);
export const RUNNING = new Set(["starting", "running_model", "running_tools"]);
// A turn is open while it runs and while its question waits for an answer.
export const TURN_OPEN = new Set([...RUNNING, "waiting_for_user_input"]);
const FOLLOW_DISTANCE_PX = 160;

/** The Message queue panel's model (message_queue.mjs), fed by the snapshot, the queue reads
 * and the composer's sends. */
export const queue = new MessageQueue();

export const state = {
  gone: false, // the session was deleted: nothing more is read or shown live
  snapshot: null, // the snapshot shown last
  status: config.status, // the status shown (the snapshot's, or one hinted by live events)
  toolNames: new Map(), // tool_call_id -> tool name, from assistant messages
  completedTurns: new Set(), // turns whose messages are stored: their live events add nothing
  currentTurn: null, // the open turn of the snapshot shown
  snapshotReads: 0, // snapshot reads started
  socket: null, // the events websocket (ResumableSocket), once the first snapshot is shown
  announcing: false, // the first snapshot is shown: later changes are announced (announcer.mjs)
};

/** Whether this person may write to the session now (the snapshot's can_send, else the
 * page's). */
export function ownerCanSend() {
  return Boolean(state.snapshot?.can_send ?? config.canSend);
}

/** Show `text` in the page's alert (none when empty); `kind` names what it is about
 * ("turn-failed" for the last turn's failure, which the next turn's start clears). */
export function showAlert(text, kind = "") {
  const alert = byId("chat-alert");
  alert.textContent = text;
  alert.hidden = !text;
  alert.dataset.kind = text ? kind : "";
}

function nearBottom() {
  const page = document.documentElement;
  return window.innerHeight + window.scrollY >= page.scrollHeight - FOLLOW_DISTANCE_PX;
}

function scrollToBottom() {
  window.scrollTo({ top: document.documentElement.scrollHeight, behavior: "instant" });
}

/** Run `change`, then keep following the newest content if the reader was at the bottom. */
export function followingChange(change, { force = false } = {}) {
  const follow = force || nearBottom();
  change();
  if (follow) scrollToBottom();
}
