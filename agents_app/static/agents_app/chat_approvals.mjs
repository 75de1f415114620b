// The chat page's pending approvals: each tool call that waits for a decision, its arguments
// and deadline countdown, Approve / Reject for staff (decision_form.mjs) or a note for the owner;
// decided or expired calls leave with the next snapshot. A link from the approvals dashboard
// ("#call-<id>") scrolls to and marks the call it names.

import { config } from "./chat_page.mjs";
import { loadSnapshot } from "./chat_snapshot.mjs";
import { copyButton } from "./copy_button.mjs";
import { decisionForm } from "./decision_form.mjs";
import { byId, el, prettyJson, refreshCountdowns } from "./dom.mjs";

function approvalNode(interrupt) {
  const item = el(
    "li",
    { class: "inline-approval", dataset: { interrupt: interrupt.interrupt_id, callId: interrupt.tool_call_id } },
    el(
      "p",
      {},
      el("strong", {}, interrupt.tool_name),
      interrupt.deadline ? [" · decision due ", el("span", { class: "countdown", "data-deadline": interrupt.deadline })] : "",
    ),
    el(
      "div",
      { class: "copyable" },
      el("pre", { class: "arguments", "aria-label": `Arguments of ${interrupt.tool_name}` }, prettyJson(interrupt.arguments)),
      copyButton("Copy arguments", () => prettyJson(interrupt.arguments)),
    ),
  );
  if (config.canApprove) {
    item.append(
      decisionForm({
        sessionId: config.session,
        interruptId: interrupt.interrupt_id,
        toolName: interrupt.tool_name,
        argumentsText: interrupt.arguments ?? "{}",
        onDecided: loadSnapshot,
      }),
    );
  } else {
    item.append(el("p", { class: "small" }, "The turn waits until a staff member approves or rejects this call."));
  }
  return item;
}

// A link from the approvals dashboard names a tool call in the fragment ("#call-<id>", urls.mjs
// sessionCallPath). Once that call is on the page (its pending approval, else the newest
// request of it in the conversation), it is scrolled into view and marked, once per page load.
let linkedCallRevealed = false;

export function revealLinkedCall() {
  const prefix = "#call-";
  if (linkedCallRevealed || !window.location.hash.startsWith(prefix)) return;
  let id;
  try {
    id = decodeURIComponent(window.location.hash.slice(prefix.length));
  } catch {
    return;
  }
  const matches = [...document.querySelectorAll("[data-call-id]")].filter((node) => node.dataset.callId === id);
  const target = matches.find((node) => node.classList.contains("inline-approval")) ?? matches.at(-1);
  if (!target) return;
  linkedCallRevealed = true;
  target.classList.add("linked-call");
  target.tabIndex = -1;
  target.scrollIntoView({ block: "center" });
  target.focus({ preventScroll: true });
}

export function renderApprovals(interrupts) {
  const list = byId("pending-approval-list");
  const wanted = new Map(interrupts.map((interrupt) => [interrupt.interrupt_id, interrupt]));
  for (const node of [...list.children]) {
    if (!wanted.has(node.dataset.interrupt)) node.remove();
  }
  const present = new Set([...list.children].map((node) => node.dataset.interrupt));
  for (const interrupt of interrupts) {
    if (!present.has(interrupt.interrupt_id)) list.append(approvalNode(interrupt));
  }
  byId("pending-approvals").hidden = interrupts.length === 0;
  refreshCountdowns(list);
}

/** Refresh the approvals' countdowns (every second); an expired call offers no decision. */
export function tickApprovals() {
  const list = byId("pending-approval-list");
  refreshCountdowns(list);
  // Dex refuses a decision after the deadline, so expired calls offer none.
  for (const item of list.children) {
    const expired = item.querySelector(".countdown")?.dataset.expired === "true";
    for (const button of item.querySelectorAll(".decision-buttons button")) if (expired) button.disabled = true;
  }
}
