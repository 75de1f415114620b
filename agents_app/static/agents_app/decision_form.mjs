// The Approve / Reject form of one pending tool call, shared by the chat page and the approvals
// dashboard: an optional rejection message (the model reads it), two buttons and a status line,
// plus, when the page passes the call's arguments, "Edit arguments" (approve with edits).
// It posts to POST /api/v1/sessions/<id>/interrupts/<interrupt_id>/ (staff only); a 409 means
// someone decided first or the deadline passed, a 400 that the tool's schema refused the edit.

import { api } from "./api.mjs";
import { dateTime, el, prettyJson } from "./dom.mjs";
import { sessionApiPath } from "./urls.mjs";

/** The 409 answer as a sentence: who decided what and when, when the server recorded a
 * decision ("Already approved by alice at 5 Dec 2026, 10:02."). */
export function conflictText(body) {
  const decision = body?.decision;
  if (!decision) return body?.detail || "This call no longer waits for a decision.";
  const verdict = decision.approved ? "approved" : "rejected";
  const when = dateTime(decision.decided_at);
  return `Already ${verdict} by ${decision.decided_by}${when ? ` at ${when}` : ""}.`;
}

/**
 * The edit to send: `{edited}` (a parsed JSON object, or undefined when the text says the same
 * as `original`) or `{error}` (a sentence) when the text is not a JSON object.
 */
export function parseEdit(text, original) {
  let edited;
  try {
    edited = JSON.parse(text);
  } catch (error) {
    return { error: `The arguments are not valid JSON: ${error.message}` };
  }
  if (!edited || typeof edited !== "object" || Array.isArray(edited)) {
    return { error: "The arguments must be a JSON object." };
  }
  let before;
  try {
    before = JSON.parse(original);
  } catch {
    before = undefined;
  }
  return { edited: JSON.stringify(edited) === JSON.stringify(before) ? undefined : edited };
}

/**
 * Build the form for the interrupt `interruptId` of session `sessionId`.
 *
 * `onDecided(approved, accepted, body)` runs after each answer from the server (accepted is
 * false when the server refused or could not be reached; body is the answer, or for a refusal
 * the error body with `status`), so the page can reload what it shows. With `argumentsText`
 * (the call's JSON arguments) an "Edit arguments" button lets staff change them before
 * approving. The buttons sit in `.decision-buttons`, so a page can disable them (an expired
 * deadline).
 */
export function decisionForm({ sessionId, interruptId, toolName = "", argumentsText = null, onDecided = async () => {} }) {
  const fieldId = `reject-${sessionId}-${interruptId}`.replace(/[^A-Za-z0-9_-]/g, "_");
  const editId = `edit-${sessionId}-${interruptId}`.replace(/[^A-Za-z0-9_-]/g, "_");
  const approve = el("button", { type: "button", class: "button-ok" }, "Approve");
  const reject = el("button", { type: "button", class: "button-danger" }, "Reject");
  const message = el("textarea", {
    id: fieldId,
    rows: 2,
    maxlength: 2000,
    placeholder: "Optional: tell the model why",
  });
  const result = el("p", { class: "decision-result small", role: "status" });
  const problems = el("ul", { class: "edit-problems small", "aria-label": "Problems with the edited arguments" });
  problems.hidden = true;
  const path = `${sessionApiPath(sessionId)}interrupts/${encodeURIComponent(interruptId)}/`;

  let editor = null;
  let editToggle = null;
  let editBlock = null;
  if (argumentsText !== null) {
    editor = el("textarea", { id: editId, class: "arguments-editor", rows: 6, spellcheck: "false", "aria-describedby": `${editId}-hint` });
    editor.value = prettyJson(argumentsText);
    editBlock = el(
      "div",
      { class: "edit-block", id: `${editId}-block` },
      el("label", { for: editId, class: "small" }, `Arguments to approve${toolName ? ` for ${toolName}` : ""} (JSON)`),
      el("p", { id: `${editId}-hint`, class: "small muted" }, "Approve runs the call with these; the model is told they were edited."),
      editor,
      problems,
    );
    editBlock.hidden = true;
    editToggle = el("button", { type: "button", class: "button-quiet edit-toggle", "aria-expanded": "false", "aria-controls": editBlock.id }, "Edit arguments");
    editToggle.addEventListener("click", () => {
      const open = editBlock.hidden;
      editBlock.hidden = !open;
      editToggle.setAttribute("aria-expanded", String(open));
      editToggle.textContent = open ? "Cancel edit" : "Edit arguments";
      approve.textContent = open ? "Approve with edits" : "Approve";
      if (open) {
        editor.focus();
      } else {
        editor.value = prettyJson(argumentsText);
        showProblems([]);
      }
    });
  }

  function showProblems(list) {
    problems.replaceChildren(...list.map((text) => el("li", {}, text)));
    problems.hidden = list.length === 0;
    editor?.setAttribute("aria-invalid", String(list.length > 0));
  }

  async function decide(approved) {
    const body = approved ? { approved: true } : { approved: false, rejection_message: message.value };
    if (approved && editBlock && !editBlock.hidden) {
      const parsed = parseEdit(editor.value, argumentsText);
      if (parsed.error) {
        showProblems([parsed.error]);
        result.textContent = "Fix the arguments before approving.";
        editor.focus();
        return;
      }
      if (parsed.edited !== undefined) body.edited_arguments = parsed.edited;
    }
    showProblems([]);
    approve.disabled = reject.disabled = true;
    if (editToggle) editToggle.disabled = true;
    result.textContent = approved ? "Approving…" : "Rejecting…";
    let accepted = false;
    let answer = null;
    try {
      answer = await api(path, { method: "POST", body });
      const verdict = approved ? (body.edited_arguments ? "Approved with edits" : "Approved") : "Rejected";
      // 202: recorded, delivered once the engine and a worker answer.
      result.textContent = answer?.delivery === "pending" ? `${verdict}; delivery pending.` : `${verdict}.`;
      accepted = true;
    } catch (error) {
      answer = { ...(error.body ?? {}), status: error.status };
      if (error.status === 409) {
        result.textContent = conflictText(error.body);
      } else if (error.status === 400 && Array.isArray(error.body?.edited_arguments)) {
        showProblems(error.body.edited_arguments);
        result.textContent = "The tool's input schema refuses these arguments.";
        editor?.focus();
      } else {
        result.textContent = error.message;
      }
      if (error.status !== 409) {
        approve.disabled = reject.disabled = false;
        if (editToggle) editToggle.disabled = false;
      }
    }
    await onDecided(approved, accepted, answer);
  }

  approve.addEventListener("click", () => decide(true));
  reject.addEventListener("click", () => decide(false));
  return el(
    "div",
    { class: "decision-form" },
    editBlock,
    el("label", { for: fieldId, class: "small" }, "Rejection message"),
    message,
    el("div", { class: "decision-buttons" }, approve, reject, editToggle),
    result,
  );
}
