// The Approve / Reject form of one pending tool call, shared by the chat page and the approvals
// dashboard: an optional rejection message (the model reads it), two buttons and a status line.
// It posts to POST /api/v1/sessions/<id>/interrupts/<interrupt_id>/ (staff only); a 409 means
// someone decided first or the deadline passed.

import { api } from "./api.mjs";
import { el } from "./dom.mjs";
import { sessionApiPath } from "./urls.mjs";

/**
 * Build the form for the interrupt `interruptId` of session `sessionId`.
 *
 * `onDecided(approved, accepted)` runs after each answer from the server (accepted is false when
 * the server refused or could not be reached), so the page can reload what it shows.
 * The buttons sit in `.decision-buttons`, so a page can disable them (an expired deadline).
 */
/** The 409 answer as a sentence: who decided what, when the server recorded a decision. */
function conflictText(body) {
  const decision = body?.decision;
  if (!decision) return "This call no longer waits for a decision.";
  const verdict = decision.approved ? "approved" : "rejected";
  return `Already ${verdict} by ${decision.decided_by}.`;
}

export function decisionForm({ sessionId, interruptId, onDecided = async () => {} }) {
  const fieldId = `reject-${sessionId}-${interruptId}`.replace(/[^A-Za-z0-9_-]/g, "_");
  const approve = el("button", { type: "button", class: "button-ok" }, "Approve");
  const reject = el("button", { type: "button", class: "button-danger" }, "Reject");
  const message = el("textarea", {
    id: fieldId,
    rows: 2,
    maxlength: 100000,
    placeholder: "Optional: tell the model why",
  });
  const result = el("p", { class: "decision-result small", role: "status" });
  const path = `${sessionApiPath(sessionId)}interrupts/${encodeURIComponent(interruptId)}/`;

  async function decide(approved) {
    approve.disabled = reject.disabled = true;
    result.textContent = approved ? "Approving…" : "Rejecting…";
    let accepted = false;
    try {
      const answer = await api(path, {
        method: "POST",
        body: approved ? { approved: true } : { approved: false, rejection_message: message.value },
      });
      const verdict = approved ? "Approved" : "Rejected";
      // 202: recorded, delivered once the engine and a worker answer.
      result.textContent = answer?.delivery === "pending" ? `${verdict}; delivery pending.` : `${verdict}.`;
      accepted = true;
    } catch (error) {
      result.textContent = error.status === 409 ? conflictText(error.body) : error.message;
      approve.disabled = reject.disabled = false;
    }
    await onDecided(approved, accepted);
  }

  approve.addEventListener("click", () => decide(true));
  reject.addEventListener("click", () => decide(false));
  return el(
    "div",
    { class: "decision-form" },
    el("label", { for: fieldId, class: "small" }, "Rejection message"),
    message,
    el("div", { class: "decision-buttons" }, approve, reject),
    result,
  );
}
