// How one stored message of the chat page reads (chat_conversation.mjs lists them): its role and
// number, time and usage, the text (Markdown for the assistant's, a sentence for the platform's
// own tool results), the collapsed reasoning, the tool calls it requested (the session's own
// tools in words), the notes a session stores when a turn ended early, Copy buttons, and for a
// text shown cut a button that reads the whole text (GET .../messages/<n>/text/) and shows it
// in place or saves it as a file.

import { api } from "./api.mjs";
import { config, sessionPath, state } from "./chat_page.mjs";
import { copyButton } from "./copy_button.mjs";
import { el, prettyJson } from "./dom.mjs";
import { renderMarkdown } from "./markdown.mjs";
import { messageTime } from "./message_times.mjs";
import { platformResultText, readTurnNotice } from "./turn_notice.mjs";
import { messageUsageBadge, messageUsageTitle } from "./usage_display.mjs";

const ROLE_LABELS = { user: config.isOwner ? "You" : config.owner, assistant: "Assistant", system: "System" };

/** Labels of the notes a session stores when a turn ended early (``message.notice``). */
const NOTICE_LABELS = { turn_cancelled: "Stopped", turn_failed: "Turn failed" };

/** A note the session stored when a turn ended early: shown as the session's notice (the
 * model reads it as a user item, but nobody typed it), without its "[Dex] " prefix. */
function noticeNode(message) {
  const label = NOTICE_LABELS[message.notice] ?? "Notice";
  return el(
    "li",
    { class: `message message-notice notice-${message.notice}`, dataset: { sequence: String(message.sequence), role: "notice" } },
    el("div", { class: "message-meta" }, el("span", { class: "badge badge-stopped message-role" }, label), el("span", {}, `#${message.sequence}`), messageTime(message.created_at)),
    ...noticeBody(message.text),
  );
}

/** A turn note's text for people (turn_notice.mjs): plain header lines, then each tool call
 * of the turn with what happened to it. */
function noticeBody(text) {
  const { lines, calls } = readTurnNotice(text);
  const nodes = lines.map((line) => el("p", { class: "message-text" }, line));
  if (calls.length) {
    nodes.push(el("ul", { class: "notice-calls" }, calls.map((call) =>
      el("li", { dataset: { status: call.status } },
        // Built-ins read in plain words ("The question"); other tools by their name.
        call.builtin ? call.label[0].toUpperCase() + call.label.slice(1) : el("code", {}, call.label),
        `: ${call.ending}`))));
  }
  return nodes;
}

/** The <li> of one stored message (a note, the owner's, the assistant's, a tool's result). */
export function messageNode(message) {
  if (message.notice) return noticeNode(message);
  const role = message.role;
  let label = ROLE_LABELS[role] ?? role;
  if (role === "tool") {
    const name = state.toolNames.get(message.tool_call_id);
    label = name ? `Tool · ${name}` : "Tool";
  }
  const node = el(
    "li",
    { class: `message message-${role}`, dataset: { sequence: String(message.sequence), role } },
    el("div", { class: "message-meta" }, el("span", { class: "message-role" }, label), el("span", {}, `#${message.sequence}`), messageTime(message.created_at)),
  );
  if (message.usage) {
    node.title = messageUsageTitle(message.usage);
    node.querySelector(".message-meta").append(messageUsageBadge(message.usage));
  }
  if (Number.isInteger(message.text_length) && message.text_length > 0) {
    // In the header, where a reader meets the message, not after pages of its start.
    node.querySelector(".message-meta").append(wholeTextControl(message));
  }
  if (message.reasoning?.text) node.append(reasoningNode(message.reasoning));
  if (message.text) {
    node.querySelector(".message-meta").append(copyButton(COPY_LABELS[role] ?? "Copy message", () => wholeTexts.get(node) ?? message.text));
    // The platform's own results ({"status": "cancelled", ...}) read as a sentence; Copy
    // still gives the text as stored.
    const plain = role === "tool" ? platformResultText(message.text, state.toolNames.get(message.tool_call_id)) : null;
    node.append(plain === null ? messageTextNode(role, message.text) : el("p", { class: "message-text platform-result" }, plain));
  }
  if (message.interrupted) {
    node.classList.add("message-interrupted");
    node.querySelector(".message-role").after(el("span", { class: "badge badge-stopped" }, "Stopped"));
    node.append(el("p", { class: "message-interrupted-note small muted" }, "Stopped: you cancelled this answer while it was being written."));
  }
  if (Array.isArray(message.tool_calls) && message.tool_calls.length) {
    node.append(el("ul", { class: "tool-requests", "aria-label": "Tool calls" }, message.tool_calls.map(toolCallNode)));
  }
  return node;
}

/** The stored reasoning of the model call behind an assistant message, collapsed under
 * "Thought for N s" (the live Thinking panel showed it while the call ran). */
function reasoningNode(reasoning) {
  const seconds = Math.max(1, Math.round(Number(reasoning.seconds) || 0));
  return el(
    "details",
    { class: "message-reasoning" },
    el("summary", {}, `Thought for ${seconds} s`),
    el("p", { class: "reasoning-text" }, reasoning.text),
    reasoning.cut ? el("p", { class: "small muted" }, "Only the start of the reasoning is kept.") : null,
  );
}

const COPY_LABELS = { tool: "Copy result" };
/** A message node's whole text once its "Show the whole text" button read it (for Copy). */
const wholeTexts = new WeakMap();

/** A message's text: Markdown for the assistant's, plain text for everyone else's. */
function messageTextNode(role, text) {
  if (role !== "assistant") return el("p", { class: "message-text" }, text);
  const node = el("div", { class: "message-text" });
  renderMarkdown(node, text);
  return node;
}

/** Texts up to this many characters are shown in the page when read whole; longer ones are
 * saved as a file instead (a page holding tens of MB of text slows the browser down). */
const SHOW_WHOLE_MAX_CHARS = 2_000_000;
/** A text that is not all ASCII is shown only up to this many characters: Chromium lays out a
 * long paragraph that mixes scripts (Latin, CJK, emoji) in time that grows much faster than
 * its length (a newcomer's 1.5 million such characters froze the tab for minutes). */
const SHOW_WHOLE_MIXED_MAX_CHARS = 200_000;
const ASCII_ONLY = /^[\x00-\x7f]*$/;

/** Every part of a message's whole text (GET .../messages/<n>/text/?part=), joined. */
async function readWholeText(sequence, onProgress) {
  const base = `${sessionPath}messages/${sequence}/text/`;
  const first = await api(`${base}?part=0`);
  const parts = [first.text];
  for (let part = 1; part < first.parts; part += 1) {
    onProgress(part, first.parts);
    parts.push((await api(`${base}?part=${part}`)).text);
  }
  return parts.join("");
}

/** Offer ``text`` as a .txt download named after the message. */
function saveText(text, sequence) {
  const url = URL.createObjectURL(new Blob([text], { type: "text/plain;charset=utf-8" }));
  el("a", { href: url, download: `session-${config.session}-message-${sequence}.txt` }).click();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

/** Whether the page can lay ``text`` out without stalling (see SHOW_WHOLE_MIXED_MAX_CHARS). */
function showable(text) {
  if (text.length > SHOW_WHOLE_MAX_CHARS) return false;
  return text.length <= SHOW_WHOLE_MIXED_MAX_CHARS || ASCII_ONLY.test(text);
}

/** For a message shown cut (a tool result longer than its record keeps, or a text past an
 * answer's budget): a button that reads the whole text, shown in place, or saved as a .txt
 * file when it is too long to lay out quickly. */
function wholeTextControl(message) {
  const length = message.text_length;
  const save = length > SHOW_WHOLE_MAX_CHARS;
  const label = `${save ? "Save" : "Show"} the whole text (${length.toLocaleString()} characters)`;
  const button = el("button", { type: "button", class: "button-quiet whole-text" }, label);
  const status = el("span", { class: "whole-text-status", role: "status" });
  const wrap = el("div", { class: "whole-text-row" }, button, status);
  button.addEventListener("click", async () => {
    button.disabled = true;
    status.textContent = "Reading…";
    try {
      const text = await readWholeText(message.sequence, (part, parts) => {
        status.textContent = `Reading part ${part + 1} of ${parts}…`;
      });
      if (!showable(text)) {
        saveText(text, message.sequence);
        status.textContent = save ? "Saved." : "Saved as a file: too long to show here.";
        button.textContent = `Save the whole text (${length.toLocaleString()} characters)`;
        button.disabled = false;
        return;
      }
      const node = wrap.closest(".message");
      const shown = node?.querySelector(".message-text");
      if (shown) shown.replaceWith(messageTextNode(node.dataset.role, text));
      else node?.append(messageTextNode(node.dataset.role, text));
      if (node) wholeTexts.set(node, text);
      wrap.remove();
    } catch (error) {
      status.textContent = `Could not read it: ${error.message}`;
      button.disabled = false;
    }
  });
  return wrap;
}

/** What a call of a tool the session runs itself does, in words; null for other tools. */
function builtinSummary(call) {
  let args;
  try {
    args = JSON.parse(call.arguments ?? "");
  } catch {
    return null;
  }
  if (!args || typeof args !== "object") return null;
  const plural = (count, word) => `${count} ${word}${count === 1 ? "" : "s"}`;
  switch (call.name) {
    case "write_todos": {
      const todos = Array.isArray(args.todos) ? args.todos : [];
      const done = todos.filter((todo) => todo?.status === "completed").length;
      return todos.length ? `Writes the plan: ${plural(todos.length, "task")}, ${done} completed` : "Clears the plan";
    }
    case "request_user_input": {
      const choices = Array.isArray(args.choices) && args.choices.length ? ` (${args.choices.join(" / ")})` : "";
      return `Asks: ${args.prompt ?? ""}${choices}`;
    }
    case "durable_wait":
      return `Waits ${args.duration_seconds ?? "?"} s${args.reason ? `: ${args.reason}` : ""}`;
    default:
      return null;
  }
}

/** One requested tool call: its name and arguments; the session's own tools (plan, question,
 * wait) say what they do, with the arguments folded away. */
function toolCallNode(call) {
  const args = el("div", { class: "copyable" }, el("pre", {}, prettyJson(call.arguments ?? "")), copyButton("Copy arguments", () => prettyJson(call.arguments ?? "")));
  const summary = builtinSummary(call);
  const dataset = call.id ? { callId: call.id } : {};
  if (summary === null) return el("li", { dataset }, "Calls ", el("code", {}, call.name ?? "?"), args);
  return el(
    "li",
    { class: "builtin-call", dataset },
    el("span", { class: "builtin-summary" }, summary),
    el("details", {}, el("summary", {}, "Arguments of ", el("code", {}, call.name)), args),
  );
}
