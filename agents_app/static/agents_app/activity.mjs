// The chat page's Activity panel: one row per AgentEvent a reader should see (tools requested,
// started and finished, approvals, waits, questions, usage, retries), oldest first, at most
// ACTIVITY_LIMIT rows.
//
// A page opened or reloaded mid-turn rebuilds the running turn's rows from the same events: it
// connects at the snapshot's live_events_after (just before the turn's turn_started) and the
// relay replays the turn's events through `add`, so a reloaded page shows what a page open
// since the turn began shows. Two corrections keep both equal and truthful:
// - tool_call_finished's `outcome` says what the status alone hides: a wait a steered message
//   ended is "interrupted", an answered question "answered", a failed call its reason (a tool
//   that is not enabled for this session says so);
// - the web side announces message_queued (and queue_changed "steered") after the engine took
//   the message, so the worker's turn_started (or steer_applied) may come first on the Stream;
//   a message's row is placed before the row of the turn start (or steer) that names it in
//   its client_ids, so a turn's start always follows its message.

import { clockTime, el } from "./dom.mjs";
import { sessionPagePath } from "./urls.mjs";
import { SUBAGENT_CANCELLED, subagentCancelled } from "./turn_notice.mjs";
import { usdDisplay } from "./usage_display.mjs";

const ACTIVITY_LIMIT = 100;

function usageText(usage) {
  if (!usage) return "";
  const parts = [`${usage.input_tokens ?? 0} in`, `${usage.output_tokens ?? 0} out`];
  if (usage.reasoning_tokens) parts.push(`${usage.reasoning_tokens} reasoning`);
  return `${parts.join(" / ")} tokens, ${usdDisplay(usage.cost_usd)}`;
}

/** The row of a tool_call_finished event: its status, corrected by its `outcome`. */
function toolFinishedRow(data) {
  const tool = data.tool_name ?? "";
  const outcome = typeof data.outcome === "string" ? data.outcome : "";
  if (subagentCancelled(tool, data.status)) {
    // A subagent call may be cancelled after its child started: the child is stopped.
    return { kind: "Tool finished", detail: `${tool}: ${SUBAGENT_CANCELLED}`, tone: "muted" };
  }
  if (data.status === "cancelled") {
    return { kind: "Tool finished", detail: `${tool}: cancelled before it ran`, tone: "muted" };
  }
  if (data.status === "succeeded" && outcome === "interrupted") {
    return { kind: "Tool finished", detail: `${tool}: interrupted`, tone: "muted" };
  }
  if (data.status === "succeeded" && (outcome === "answered" || outcome === "completed")) {
    return { kind: "Tool finished", detail: `${tool}: ${outcome}`, tone: "ok" };
  }
  const tone = data.status === "succeeded" ? "ok" : data.status === "rejected" ? "warn" : "error";
  const detail = `${tool}: ${data.status ?? "done"}` + (outcome && data.status !== "succeeded" ? ` (${outcome})` : "");
  return { kind: "Tool finished", detail, tone };
}

/** {kind, detail, tone} for an AgentEvent, or null for events not shown as activity. */
export function activityRow(event, withdrawn = new Set()) {
  const data = event.data ?? {};
  const tool = data.tool_name ?? "";
  switch (event.type) {
    case "turn_started":
      return {
        kind: "Turn started",
        detail: (event.turn_id ?? "") + (data.plan_revision ? ` (executing plan revision ${data.plan_revision})` : ""),
      };
    case "turn_completed":
      return { kind: "Turn completed", detail: event.turn_id ?? "", tone: "ok" };
    case "turn_failed":
      return { kind: "Turn failed", detail: data.error ?? "", tone: "error" };
    case "turn_cancelled":
      return { kind: "Turn cancelled", detail: event.turn_id ?? "", tone: "muted" };
    case "tool_call_deferred":
      return {
        kind: "Tool requested",
        detail: `${tool} (${data.effect ?? "unknown effect"}${data.requires_approval ? ", needs approval" : ""})`,
      };
    case "tool_call_started":
      return { kind: "Tool started", detail: tool };
    case "tool_call_finished":
      return toolFinishedRow(data);
    case "interrupt_raised":
      return { kind: "Approval requested", detail: tool + (data.deadline ? ` (deadline ${clockTime(new Date(data.deadline))})` : ""), tone: "warn" };
    case "interrupt_resolved":
      if (data.superseded || withdrawn.has(data.interrupt_id)) {
        return { kind: "Approval withdrawn", detail: data.rejection_message || data.interrupt_id || "", tone: "muted" };
      }
      return data.approved
        ? { kind: data.edited ? "Approved with edits" : "Approved", detail: data.interrupt_id ?? "", tone: "ok" }
        : { kind: "Rejected", detail: data.rejection_message || data.interrupt_id || "", tone: "warn" };
    case "usage_recorded":
      return { kind: "Usage", detail: `${usageText(data.recorded)} (session: ${usageText(data.session)})` };
    case "tool_progress": {
      const amount = data.total ? `${data.progress}/${data.total}` : `${data.progress ?? ""}`;
      return { kind: "Tool progress", detail: `${tool} ${amount}${data.message ? ` ${data.message}` : ""}` };
    }
    case "tool_log":
      return { kind: `Tool log (${data.level ?? "info"})`, detail: `${tool}: ${typeof data.data === "string" ? data.data : JSON.stringify(data.data)}` };
    case "steer_applied": {
      const count = data.message_count ?? 0;
      const withdrawn = Array.isArray(data.withdrawn_interrupt_ids) ? data.withdrawn_interrupt_ids.length : 0;
      const detail = `${count} steered message${count === 1 ? "" : "s"} applied` + (withdrawn ? `; ${withdrawn} approval${withdrawn === 1 ? "" : "s"} withdrawn` : "");
      return { kind: "Steered", detail, tone: "warn" };
    }
    case "message_queued":
    case "queue_changed":
      return data.change ? { kind: "Queue changed", detail: QUEUE_CHANGES[data.change] ?? data.change } : { kind: "Message queued", detail: "" };
    case "session_stopped":
      return { kind: "Session stopped", detail: data.reason ?? "", tone: "warn" };
    case "user_input_requested": {
      const choices = Array.isArray(data.choices) && data.choices.length ? ` (${data.choices.join(" / ")})` : " (free text)";
      return { kind: "Question", detail: `${data.prompt ?? ""}${choices}`, tone: "warn" };
    }
    case "user_input_answered":
      return { kind: "Answered", detail: "the turn goes on with the answer", tone: "ok" };
    case "elicitation_requested":
      return { kind: `Question from ${data.server || "the MCP server"}`, detail: `${data.message ?? ""}${data.mode === "url" ? " (a link to open)" : ""}`, tone: "warn" };
    case "elicitation_closed":
      return elicitationClosedRow(data);
    case "durable_wait_started": {
      const until = data.fires_at ? new Date(data.fires_at) : null;
      const when = until && !Number.isNaN(until.getTime()) ? `until ${clockTime(until)}` : `${data.duration_seconds ?? "?"} s`;
      return { kind: "Waiting", detail: `${when}${data.reason ? `: ${data.reason}` : ""}` };
    }
    case "plan_updated": {
      const count = data.task_count ?? 0;
      return { kind: "Plan updated", detail: `revision ${data.revision}: ${data.status}, ${count} task${count === 1 ? "" : "s"}` };
    }
    case "plan_started":
      return { kind: "Plan started", detail: `executing revision ${data.revision}`, tone: "ok" };
    case "context_compaction_started":
      return { kind: "Compacting context", detail: `summarizing messages up to ${data.through_sequence}`, tone: "muted" };
    case "context_compacted":
      return { kind: "Context compacted", detail: `messages up to ${data.through_sequence} summarized`, tone: "muted" };
    case "subagent_started":
      return {
        kind: "Subagent started",
        detail: `${tool}${data.depth ? ` (depth ${data.depth})` : ""}: open its session`,
        href: data.child_session_id ? sessionPagePath(data.child_session_id) : null,
      };
    case "subagent_finished": {
      const tone = data.outcome === "completed" ? "ok" : data.outcome === "cancelled" ? "muted" : "error";
      return {
        kind: "Subagent finished",
        detail: `${tool}: ${data.outcome ?? "ended"}`,
        tone,
        href: data.child_session_id ? sessionPagePath(data.child_session_id) : null,
      };
    }
    case "attempt_retried":
      return { kind: "Retrying", detail: `${data.what} (attempt ${data.attempt}); the earlier attempt's text is dropped`, tone: "warn" };
    default:
      return null;
  }
}

const ELICITATION_ENDINGS = {
  accepted: { kind: "Answered", tone: "ok", detail: "the server got the answer" },
  declined: { kind: "Declined", tone: "warn", detail: "the server was told no" },
  cancelled: { kind: "Question cancelled", tone: "muted", detail: "the server was told cancel" },
  expired: { kind: "Question expired", tone: "warn", detail: "no answer before the deadline; the server was told cancel" },
  withdrawn: { kind: "Question withdrawn", tone: "muted", detail: "the server was told cancel" },
};
const WITHDRAWN_REASONS = {
  steered: "a steered message superseded it",
  call_ended: "the tool call ended",
  superseded: "the server asked something else",
  not_running: "the tool call was not running",
};

function elicitationClosedRow(data) {
  const ending = ELICITATION_ENDINGS[data.status] ?? { kind: "Question closed", tone: "muted", detail: data.status ?? "" };
  let detail = ending.detail;
  if (data.status === "withdrawn" && data.reason) detail = `${WITHDRAWN_REASONS[data.reason] ?? data.reason}; ${detail}`;
  if (data.reused) detail = `${detail} (the answer given before the call was retried)`;
  return { kind: ending.kind, detail, tone: ending.tone };
}

const QUEUE_CHANGES = {
  deleted: "a queued message was deleted",
  edited: "a queued message was edited",
  steered: "a queued message was steered into the turn",
};

/** What took a queued message: the turn_started or steer_applied row naming it. */
const TAKING_EVENTS = new Set(["turn_started", "steer_applied"]);
/** The rows of a message the engine may have taken before the web announced it. */
export function announcedMessageId(event) {
  const data = event.data ?? {};
  if (event.type === "message_queued" || (event.type === "queue_changed" && data.change === "steered")) {
    return typeof data.message_id === "string" && data.message_id ? data.message_id : null;
  }
  return null;
}

/** A row's detail: a link to the row's session (a subagent's child) when it names one. */
function detailNode(row) {
  if (row.href) return el("a", { class: "detail", href: row.href }, row.detail);
  return el("span", { class: "detail" }, row.detail);
}

/** The Activity list of one chat page. */
export class ActivityLog {
  /** @param {{list: HTMLOListElement, empty: HTMLElement}} nodes the list and its "nothing yet" note */
  constructor({ list, empty }) {
    this.list = list;
    this.empty = empty;
    this.withdrawn = new Set(); // interrupt IDs a steer withdrew (steer_applied)
    this.attempts = new Map(); // step_execution_id -> highest attempt seen
    this.takenBy = new Map(); // a message's client ID -> the row of the event that took it
    this.groups = new Map(); // a subagent child's session ID -> its SubagentGroup
  }

  /**
   * Note what every event (live text included) tells the log: the approvals a steer withdrew,
   * and a Step attempt above the highest seen for its Step execution, which means the earlier
   * attempt failed (a worker died, a model call errored) and runs again: a "Retrying" row.
   */
  note(event) {
    if (event.type === "steer_applied") {
      for (const id of event.data?.withdrawn_interrupt_ids ?? []) this.withdrawn.add(id);
    }
    const id = event.step_execution_id;
    if (!id || !Number.isInteger(event.attempt)) return;
    const seen = this.attempts.get(id);
    this.attempts.set(id, Math.max(seen ?? 0, event.attempt));
    if (seen !== undefined && event.attempt > seen) {
      const what = id.startsWith("RunModel") ? "model call" : id.replace(/-\d+$/, "");
      this.add({ type: "attempt_retried", created_at: event.created_at, data: { what, attempt: event.attempt } });
    }
  }

  /**
   * The nested group of the subagent child session `childId` (issue 29), made on first use:
   * a row holding a <details> with the child's rows. A group made from the children read
   * (`placed` false: its call's own events were not replayed) moves to the end when its
   * `subagent_started` arrives, so it follows the rows before the call.
   *
   * @param {string} childId the child session's ID
   * @param {{toolName?: string, title?: string, parent?: SubagentGroup | null, placed?: boolean}} options
   * @returns {{group: SubagentGroup, created: boolean}}
   */
  subagent(childId, { toolName = "", title = "", parent = null, placed = true } = {}) {
    let group = this.groups.get(childId);
    const created = !group;
    if (!group) {
      group = new SubagentGroup({ childId, toolName, title, withdrawn: this.withdrawn });
      this.groups.set(childId, group);
      group.placed = placed;
      this.place(group.node, parent);
    } else if (placed && !group.placed) {
      group.placed = true;
      this.place(group.node, parent);
    }
    if (title) group.retitle(title);
    return { group, created };
  }

  /** Append `node` to the list (or to the nested group `parent`), keeping the newest in view. */
  place(node, parent = null) {
    if (parent) {
      parent.list.append(node);
      return;
    }
    const list = this.list;
    const atEnd = list.scrollTop + list.clientHeight >= list.scrollHeight - 24;
    list.append(node);
    while (list.children.length > ACTIVITY_LIMIT) list.firstElementChild.remove();
    this.empty.hidden = true;
    if (atEnd) list.scrollTop = list.scrollHeight;
  }

  /** Add the row of `event` (nothing for events Activity does not show). */
  add(event, shown = null) {
    const row = shown ?? activityRow(event, this.withdrawn);
    if (!row) return;
    const list = this.list;
    const atEnd = list.scrollTop + list.clientHeight >= list.scrollHeight - 24;
    const node = rowNode(event, row);
    const taker = this.takenBy.get(announcedMessageId(event));
    if (taker?.isConnected) list.insertBefore(node, taker);
    else list.append(node);
    if (TAKING_EVENTS.has(event.type)) {
      for (const id of event.data?.client_ids ?? []) this.takenBy.set(id, node);
    }
    while (list.children.length > ACTIVITY_LIMIT) list.firstElementChild.remove();
    this.empty.hidden = true;
    if (atEnd) list.scrollTop = list.scrollHeight;
  }
}

/** The <li> of one Activity row. */
function rowNode(event, row) {
  const when = event.created_at ? new Date(event.created_at) : new Date();
  return el(
    "li",
    { class: row.nested ? "activity-row activity-nested" : "activity-row", dataset: { type: event.type, tone: row.tone ?? "" } },
    el("time", { datetime: when.toISOString() }, clockTime(when)),
    el("span", {}, el("span", { class: "kind" }, row.kind), row.detail ? " " : "", row.detail ? detailNode(row) : ""),
  );
}

/** What a subagent call's state is called in its group's summary. */
const SUBAGENT_STATES = { running: "running", completed: "finished", ended: "finished", failed: "failed", cancelled: "cancelled" };
/** The child's events that end its (only) turn, and the state each leaves the call in. */
const CHILD_TURN_ENDS = { turn_completed: "completed", turn_failed: "failed", turn_cancelled: "cancelled" };

/** "agent__demo: 3 tool calls, finished". */
export function subagentSummary({ toolName, toolCalls, state }) {
  const calls = `${toolCalls} tool call${toolCalls === 1 ? "" : "s"}`;
  return `${toolName || "subagent"}: ${calls}, ${SUBAGENT_STATES[state] ?? state}`;
}

/** "Subagent demo session Find the invoice": the accessible name of a child's nested rows. */
export function subagentGroupLabel({ toolName, title, childId }) {
  return `Subagent ${subagentAgent(toolName)} session ${title || childId}`;
}

/** The agent a subagent tool calls: "demo" for "agent__demo". */
export function subagentAgent(toolName) {
  return String(toolName || "").replace(/^agent__/, "") || "subagent";
}

/**
 * What a subagent child's events say, without the DOM: which events were taken already (by
 * their resume token, so the live feed and a replay of the same Stream add each row once),
 * the child's tool calls, and the call's state ("running" until the child's turn ends or the
 * parent's `subagent_finished` says how; "ended" when only the index says it stopped).
 */
export class SubagentTally {
  constructor() {
    this.tokens = new Set();
    this.toolCalls = new Set();
    this.state = "running";
  }

  /** Take one child event; false when its `token` was taken before (show nothing). */
  take(event, token = "") {
    if (token) {
      if (this.tokens.has(token)) return false;
      this.tokens.add(token);
    }
    const id = event.data?.tool_call_id;
    if (event.type === "tool_call_deferred" && typeof id === "string" && id) this.toolCalls.add(id);
    const ended = CHILD_TURN_ENDS[event.type];
    if (ended) this.end(ended);
    return true;
  }

  /** The call ended as `state`; a known ending is not replaced by the vaguer "ended". */
  end(state) {
    if (state === "ended" && this.state !== "running") return false;
    const changed = this.state !== state;
    this.state = state;
    return changed;
  }
}

/**
 * One subagent call's child session in Activity: a row holding a <details> whose summary says
 * "agent__demo: 3 tool calls, finished" (open while the call runs, closed once it ended), a
 * link to the child's page, and the child's rows in a list named for the child
 * (`subagentGroupLabel`). A grandchild's group nests in it the same way.
 */
export class SubagentGroup {
  constructor({ childId, toolName = "", title = "", withdrawn = new Set() }) {
    this.childId = childId;
    this.toolName = toolName;
    this.title = title;
    this.withdrawn = withdrawn;
    this.tally = new SubagentTally();
    this.placed = true;
    this.summaryText = el("span", { class: "detail" });
    this.list = el("ol", { class: "activity-subagent-list" });
    this.details = el(
      "details",
      { class: "activity-subagent", open: true },
      el("summary", {}, el("span", { class: "kind" }, "Subagent"), " ", this.summaryText),
      this.list,
    );
    this.link = el("a", { class: "activity-subagent-link small", href: sessionPagePath(childId) });
    this.node = el("li", { class: "activity-row activity-subagent-row", dataset: { type: "subagent", child: childId } }, el("span", { class: "kind" }, "↳"), el("div", {}, this.details, this.link));
    this.render();
  }

  /** Name the group after the child's title (read from the index). */
  retitle(title) {
    this.title = title;
    this.render();
  }

  /** Add the row of one child event (once per token); its turn's end closes the group. */
  add(event, token = "") {
    const wasRunning = this.tally.state === "running";
    if (!this.tally.take(event, token)) return false;
    const row = event.type === "usage_recorded" ? null : activityRow(event, this.withdrawn);
    if (row) this.list.append(rowNode(event, { ...row, nested: true }));
    if (wasRunning && this.tally.state !== "running") this.details.open = false;
    this.render();
    return true;
  }

  /** The call ended as `state` (the parent's subagent_finished outcome, or "ended"). */
  end(state) {
    const wasRunning = this.tally.state === "running";
    if (!this.tally.end(state)) return;
    if (wasRunning) this.details.open = false;
    this.render();
  }

  render() {
    const { state, toolCalls } = this.tally;
    this.summaryText.textContent = subagentSummary({ toolName: this.toolName, toolCalls: toolCalls.size, state });
    this.list.setAttribute("aria-label", subagentGroupLabel(this));
    this.link.textContent = `Open the ${subagentAgent(this.toolName)} session`;
    this.node.dataset.state = state;
  }
}
