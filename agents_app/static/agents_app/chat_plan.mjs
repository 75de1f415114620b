// The chat page's plan card: the snapshot's plan (session_panels.mjs words it), its tasks and
// progress, and Execute plan / Continue plan (POST .../plan/execute/ with the revision shown),
// which waits for an empty queue; a refusal says why in the card. The snapshot is re-read on
// plan_updated and plan_started (chat_live.mjs) and after every write.

import { api } from "./api.mjs";
import { ownerCanSend, queue, sessionPath, state } from "./chat_page.mjs";
import { loadSnapshot } from "./chat_snapshot.mjs";
import { byId, el } from "./dom.mjs";
import { planCard } from "./session_panels.mjs";

const PLAN_ERRORS = {
  stale_revision: "The plan changed since you read it; review the new revision.",
  busy: "The agent is busy; try again once it waits for a message.",
  queued: "Messages wait in the queue; they run first.",
  already_requested: "Execution was already requested.",
  not_executable: "Every task of the plan is completed.",
};
let planShownRead = 0;
const execution = {
  posting: false, // an Execute / Continue request is in flight
  requestedBefore: 0, // snapshot reads started before an accepted execution show it requested
};

/** Show the plan card for the snapshot of read number `read` (0: the one shown, again). */
export function renderPlan(read = planShownRead) {
  planShownRead = read;
  const requested = execution.posting || read <= execution.requestedBefore;
  const card = planCard(state.snapshot, { canSend: ownerCanSend(), waiting: queue.count, requested });
  const panel = byId("plan");
  panel.hidden = card === null;
  if (!card) return;
  panel.dataset.status = card.status;
  byId("plan-meta").textContent = `Revision ${card.revision} · ${card.statusText} · ${card.progress}`;
  const list = byId("plan-tasks");
  list.replaceChildren(
    ...card.tasks.map((task) =>
      el(
        "li",
        { class: "plan-task", dataset: { status: task.status } },
        el("span", { class: "task-mark", "aria-hidden": "true" }, task.mark),
        el("span", { class: "visually-hidden" }, `${task.statusText}: `),
        el("span", { class: "task-text" }, task.content),
      ),
    ),
  );
  const button = byId("plan-execute");
  button.hidden = card.action === null;
  button.disabled = execution.posting;
  if (card.action) {
    button.textContent = card.action.label;
    button.dataset.revision = String(card.action.revision);
  }
  let note = "";
  if (card.requested) note = "Execution requested…";
  else if (card.executing) note = "Executing the plan…";
  else if (card.status === "completed") note = "Every task is completed.";
  byId("plan-state").textContent = note;
}

function showPlanError(text) {
  const node = byId("plan-error");
  node.textContent = text;
  node.hidden = !text;
}

/** Execute or continue the plan revision the card shows (POST .../plan/execute/). */
export async function executePlan() {
  const button = byId("plan-execute");
  const revision = Number(button.dataset.revision);
  if (execution.posting || !Number.isInteger(revision)) return;
  execution.posting = true;
  showPlanError("");
  renderPlan();
  try {
    await api(`${sessionPath}plan/execute/`, { method: "POST", body: { revision } });
    // Reads that started before the engine accepted it may still show the plan idle.
    execution.requestedBefore = state.snapshotReads;
  } catch (error) {
    const reason = error.body?.reason;
    showPlanError(`Not started: ${PLAN_ERRORS[reason] ?? error.message}`);
  } finally {
    execution.posting = false;
    renderPlan();
  }
  loadSnapshot();
}

