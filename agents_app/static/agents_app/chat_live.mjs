// The chat page's live view, from the session's events websocket (ws_client.mjs resumes after
// the last token it delivered, so across reconnects nothing is lost or shown twice): the
// Response and Thinking panels (live_text.mjs groups the text by turn, Step and attempt), the
// Activity log and the Timeline, status hints until the next snapshot says for sure, the reads
// each event calls for, and the connection indicator. It also owns the page's final state once
// the session is deleted (a 4404 close, a session_stopped "deleted by user" or a 404 read).

import { ActivityLog } from "./activity.mjs";
import { api } from "./api.mjs";
import { announce } from "./announcer.mjs";
import { newestSequence } from "./chat_conversation.mjs";
import { showStatus } from "./chat_header.mjs";
import { RUNNING, config, followingChange, sessionPath, showAlert, state } from "./chat_page.mjs";
import { loadQueue } from "./chat_queue.mjs";
import { cancelScheduledSnapshot, loadSnapshot, scheduleSnapshot } from "./chat_snapshot.mjs";
import { byId, el } from "./dom.mjs";
import { LiveText } from "./live_text.mjs";
import { renderMarkdownSoon } from "./markdown.mjs";
import { Timeline } from "./timeline.mjs";
import { showSessionUsage } from "./usage_display.mjs";
import { sessionsApiPath } from "./urls.mjs";
import { ResumableSocket, websocketUrl } from "./ws_client.mjs";

const TURN_END_RETRY_MS = 300;
const TURN_END_MAX_TRIES = 30;

const turns = {
  ending: new Map(), // turn_id -> {messageCount, tries}: ended, its messages not yet shown
  writingTurns: new Set(), // turns whose streamed answer was announced as being written
};

const live = new LiveText();
const activity = new ActivityLog({ list: byId("activity-list"), empty: byId("activity-empty") });
const timeline = new Timeline({
  sessionId: config.session,
  historyPath: `${sessionPath}history/`,
  tablist: document.querySelector(".chat-tabs"),
  panel: byId("timeline-panel"),
  toolName: (id) => state.toolNames.get(id) ?? state.snapshot?.tool_calls?.find((call) => call.tool_call_id === id)?.tool_name,
});

/** Show the live groups of `kind` ("response" or "thinking"); the panel hides while empty. */
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

export function renderAllLive() {
  renderLive("response");
  renderLive("thinking");
}

/** Drop the live text of turns whose messages the conversation now shows. */
export function dropFinishedLiveText() {
  live.dropWhere((group) => state.completedTurns.has(group.turnId));
}

/** Once a turn ended, keep its live text until the snapshot shows its messages (the engine may
 * announce the end a moment before they are readable), re-reading until then. */
export function settleEndingTurns(snapshot) {
  const newest = newestSequence();
  let retry = false;
  for (const [turnId, ending] of turns.ending) {
    const stored =
      ending.messageCount !== null && ending.messageCount !== undefined
        ? newest >= ending.messageCount
        : !RUNNING.has(snapshot.status) || state.currentTurn !== turnId;
    if (stored || ending.tries >= TURN_END_MAX_TRIES) {
      live.dropTurn(turnId);
      state.completedTurns.add(turnId);
      turns.ending.delete(turnId);
    } else {
      ending.tries += 1;
      retry = true;
    }
  }
  // The engine may announce the end of a turn a moment before its messages are readable.
  if (retry) setTimeout(loadSnapshot, TURN_END_RETRY_MS);
}

/** The session was deleted (in another tab, by staff, or here): a final state. The status
 * reads "Deleted", the live panels, the composer and every control are gone, the alert says
 * so at the top, and the page stops reading the session (no repeated 404s). */
export function showSessionGone() {
  if (state.gone) return;
  state.gone = true;
  state.socket?.stop();
  for (const feed of children.values()) stopFeed(feed);
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

/**
 * Show a status the events imply until the next snapshot says for sure; a pending approval
 * (known only from the snapshot) is not overridden by replayed events.
 */
function hintStatus(status) {
  if (state.snapshot?.awaiting_approval || state.status === "stopped") return;
  if (state.status !== status) showStatus(status, null);
}

/** One frame of the socket: the Timeline hears every event; events of turns whose messages are
 * stored add nothing more; live text fills its panel; the rest goes to Activity and asks for
 * the reads it calls for. */
function onEvent(frame) {
  const event = frame.event;
  if (state.gone || !event || typeof event.type !== "string") return;
  timeline.onEvent(event);
  // Replays of turns whose messages are already stored add nothing.
  if (event.turn_id && state.completedTurns.has(event.turn_id)) return;
  activity.note(event);
  const group = live.apply(event);
  if (group) {
    if (group.kind === "response" && event.turn_id && !turns.writingTurns.has(event.turn_id)) {
      turns.writingTurns.add(event.turn_id);
      announce("The assistant is writing an answer…");
    }
    hintStatus("running_model");
    followingChange(() => renderLive(group.kind));
    return;
  }
  activity.add(event);
  followSubagent(event);
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
      turns.ending.set(event.turn_id, { messageCount: event.data?.message_count ?? null, tries: 0 });
      loadSnapshot();
      break;
    case "turn_failed":
      turns.ending.set(event.turn_id, { messageCount: null, tries: 0 });
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

/** The followed child sessions of this page's subagent calls (and theirs): child ID -> feed. */
const children = new Map();
/** A child's events after which it does nothing more the parent's Activity shows. */
const CHILD_ENDINGS = new Set(["turn_completed", "turn_failed", "turn_cancelled", "session_stopped"]);
/** How long a child's feed waits for more replayed events once its call is known to be over
 * (a child whose turn's events are no longer retained never sends its ending). */
const CHILD_SETTLE_MS = 5000;
/** How deep Activity nests children of children (the engine's depth limit is 3 by default). */
export const SUBAGENT_NESTING_LIMIT = 5;

/**
 * Subagents (issue 29): the child session of each subagent call shows in Activity as a group
 * nested under the call (activity.mjs `SubagentGroup`), filled from the child's own events
 * socket from its oldest retained event: the events of a call that ended before the page
 * opened are replayed, those of a running call go on live, and the socket's resume tokens keep
 * each row once. The socket stops at the end of the child's turn, or once the call is over
 * and nothing more arrives (`CHILD_SETTLE_MS`). A child's own subagent calls nest in its group.
 */
function followChild(childId, { toolName = "", title = "", parent = null, placed = true, depth = 1 } = {}) {
  const { group } = activity.subagent(childId, { toolName, title, parent, placed });
  if (children.has(childId) || depth > SUBAGENT_NESTING_LIMIT) return children.get(childId) ?? null;
  const feed = { group, socket: null, settle: null, over: false };
  children.set(childId, feed);
  feed.socket = new ResumableSocket({
    url: websocketUrl(`/ws/sessions/${encodeURIComponent(childId)}/events/`),
    onEvent: (frame) => {
      const event = frame.event;
      if (!event || typeof event.type !== "string" || !group.add(event, frame.token)) return;
      const grandchild = event.data?.child_session_id;
      if (typeof grandchild === "string" && grandchild) {
        if (event.type === "subagent_started") {
          followChild(grandchild, { toolName: event.data?.tool_name ?? "", parent: group, depth: depth + 1 });
          readChildren(childId, group, depth + 1);
        } else if (event.type === "subagent_finished") {
          callOver(grandchild, event.data?.outcome);
        }
      }
      if (CHILD_ENDINGS.has(event.type)) stopFeed(feed);
      else if (feed.over) settleFeed(feed);
    },
    // A child the relay refuses (deleted, not readable) shows what the index said.
    onStateChange: (socketState) => {
      if (socketState === "refused") stopFeed(feed);
    },
  });
  feed.socket.start();
  return feed;
}

function stopFeed(feed) {
  clearTimeout(feed.settle);
  feed.socket?.stop();
}

function settleFeed(feed) {
  clearTimeout(feed.settle);
  feed.settle = setTimeout(() => {
    feed.group.end("ended");
    feed.socket?.stop();
  }, CHILD_SETTLE_MS);
}

/** The call of child `childId` is over (`outcome`: the parent's subagent_finished, or none). */
function callOver(childId, outcome) {
  const feed = children.get(childId);
  if (!feed) return;
  if (typeof outcome === "string" && outcome) feed.group.end(outcome);
  feed.over = true;
  settleFeed(feed);
}

/**
 * Read the children of `parentId` from the sessions index (`?parent=`): each gets its group
 * (named after its title) and is followed; one the index says stopped is over. A read that
 * fails leaves what the events showed.
 */
async function readChildren(parentId, parent = null, depth = 1) {
  let page;
  try {
    page = await api(`${sessionsApiPath}?parent=${encodeURIComponent(parentId)}&limit=100&ordering=created_at`);
  } catch {
    return;
  }
  for (const row of (Array.isArray(page) ? page : page?.results) ?? []) {
    if (typeof row?.id !== "string") continue;
    followChild(row.id, { toolName: row.agent ? `agent__${row.agent}` : "", title: row.title ?? "", parent, placed: false, depth });
    if (row.status === "stopped") callOver(row.id, null);
  }
}

/** A parent event about one of its subagent calls. */
function followSubagent(event) {
  const childId = event.data?.child_session_id;
  if (typeof childId !== "string" || !childId) return;
  if (event.type === "subagent_started") {
    followChild(childId, { toolName: event.data?.tool_name ?? "" });
    readChildren(config.session);
  } else if (event.type === "subagent_finished") {
    callOver(childId, event.data?.outcome);
  }
}

export function startSocket(snapshot) {
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
  readChildren(config.session);
}
