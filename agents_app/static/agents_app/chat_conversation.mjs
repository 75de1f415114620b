// The chat page's conversation: the stored messages of the snapshots read so far and of the
// older pages loaded above them (GET .../messages/?before=), shown in order with day separators
// and each turn's usage, new answers told to a screen reader, and the summary compaction wrote
// folded above. Which messages are shown is this module's; how each one reads is
// chat_messages.mjs's.

import { announce } from "./announcer.mjs";
import { api } from "./api.mjs";
import { messageNode } from "./chat_messages.mjs";
import { config, sessionPath, state } from "./chat_page.mjs";
import { byId } from "./dom.mjs";
import { dayBreaks, placeDaySeparators } from "./message_times.mjs";
import { showTurnUsage } from "./usage_display.mjs";

const OLDER_PAGE_SIZE = 50;

const shown = {
  messages: new Map(), // sequence -> message
  nodes: new Map(), // sequence -> <li>
  daySeparators: new Map(), // sequence -> the day separator <li> before that message
  oldest: null, // the oldest sequence loaded
  hasOlder: false,
  loadingOlder: false,
  olderUnavailable: false,
  announcedUpTo: 0, // the newest message sequence a screen reader was told of (or shown at load)
};

/** The newest message sequence loaded (0 before any). */
export function newestSequence() {
  return shown.messages.size ? Math.max(...shown.messages.keys()) : 0;
}

function rememberMessages(messages) {
  for (const message of messages) {
    if (!Number.isInteger(message?.sequence)) continue;
    shown.messages.set(message.sequence, message);
    for (const call of message.tool_calls ?? []) {
      if (call?.id) state.toolNames.set(call.id, call.name);
    }
  }
}

export function renderMessages() {
  const list = byId("messages");
  const sequences = [...shown.messages.keys()].sort((a, b) => a - b);
  for (const [sequence, node] of shown.nodes) {
    if (!shown.messages.has(sequence)) {
      node.remove();
      shown.nodes.delete(sequence);
    }
  }
  let next = null;
  // Walk newest to oldest so each new node goes in front of its successor.
  for (let index = sequences.length - 1; index >= 0; index -= 1) {
    const sequence = sequences[index];
    let node = shown.nodes.get(sequence);
    if (!node) {
      node = messageNode(shown.messages.get(sequence));
      shown.nodes.set(sequence, node);
      list.insertBefore(node, next);
    }
    next = node;
  }
  placeDaySeparators(list, dayBreaks(sequences.map((sequence) => shown.messages.get(sequence))), shown.nodes, shown.daySeparators);
  announceNewAnswers(sequences);
  showTurnUsage(shown.messages.values(), shown.nodes);
  const empty = byId("conversation-empty");
  empty.hidden = sequences.length > 0;
  if (!sequences.length) {
    empty.textContent = config.canSend ? "No messages yet. Write the first one below." : "No messages yet.";
  }
  byId("load-older").hidden = !shown.hasOlder || shown.olderUnavailable;
}

/** Tell a screen reader of answers stored since the last render (none for the first one, or
 * for older pages loaded above). */
function announceNewAnswers(sequences) {
  const newest = sequences.length ? sequences[sequences.length - 1] : 0;
  if (state.announcing) {
    for (const sequence of sequences) {
      if (sequence <= shown.announcedUpTo) continue;
      const message = shown.messages.get(sequence);
      if (message?.role === "assistant" && message.text) announce(`Assistant: ${message.text}`);
    }
  }
  shown.announcedUpTo = Math.max(shown.announcedUpTo, newest);
}

export function mergeSnapshotMessages(messages) {
  if (!messages.length) return;
  const newestKnown = newestSequence();
  const first = messages[0].sequence;
  if (shown.messages.size && first > newestKnown + 1) {
    // More messages arrived than a snapshot holds: the pages in between are not loaded, so
    // start again from this window instead of showing a silent gap.
    shown.messages.clear();
    shown.oldest = null;
  }
  rememberMessages(messages);
  if (shown.oldest === null || first <= shown.oldest) {
    shown.oldest = first;
    shown.hasOlder = state.snapshot?.has_older_messages ?? first > 1;
  }
}

/** Load older messages while the top of the conversation is on screen. */
export function loadOlderIfVisible() {
  if (!shown.hasOlder || shown.olderUnavailable || shown.loadingOlder) return;
  const box = byId("older-sentinel").getBoundingClientRect();
  if (box.bottom >= 0 && box.top <= window.innerHeight) loadOlder();
}

export async function loadOlder() {
  if (state.gone) return;
  if (shown.loadingOlder || !shown.hasOlder || shown.olderUnavailable || shown.oldest === null) return;
  shown.loadingOlder = true;
  const button = byId("load-older");
  button.disabled = true;
  button.textContent = "Loading older messages…";
  let loaded = false;
  try {
    const page = await api(`${sessionPath}messages/?before=${shown.oldest}&limit=${OLDER_PAGE_SIZE}`);
    const messages = page?.messages ?? [];
    const heightBefore = document.documentElement.scrollHeight;
    const top = window.scrollY;
    rememberMessages(messages);
    if (messages.length) shown.oldest = Math.min(shown.oldest, messages[0].sequence);
    shown.hasOlder = page?.next_before !== null && page?.next_before !== undefined && messages.length > 0;
    renderMessages();
    // Keep the message that was on screen where it was.
    window.scrollTo({ top: top + document.documentElement.scrollHeight - heightBefore, behavior: "instant" });
    loaded = true;
  } catch (error) {
    if (error.status === 404 || error.status === 405) shown.olderUnavailable = true;
  } finally {
    shown.loadingOlder = false;
    button.disabled = false;
    button.textContent = "Load older messages";
    byId("load-older").hidden = !shown.hasOlder || shown.olderUnavailable;
  }
  // A short conversation may still show its top: keep going until it does not (after a
  // failure, the next snapshot or scroll tries again).
  if (loaded) loadOlderIfVisible();
}

/** The cumulative summary compaction wrote, folded above the conversation (none before the
 * first compaction). */
export function renderSummary(summary) {
  const box = byId("context-summary");
  box.hidden = !summary;
  if (!summary) return;
  byId("context-summary-title").textContent =
    `Summary of earlier messages (through message ${summary.through_sequence})`;
  byId("context-summary-text").textContent = summary.text;
}
