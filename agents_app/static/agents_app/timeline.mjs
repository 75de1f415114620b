// The chat page's Timeline tab: every Step of the session (GET /api/v1/sessions/<id>/history/),
// oldest first, with its methods' attempts, durations and status, the tool call, model call or
// approval it belongs to, and the error of the last failed attempt. A Step's status says what
// its ending meant when the Step recorded it (a refused or cancelled model call, a withdrawn or
// expired approval), and a wait's time is the time it really waited.
//
// Live without polling: every event the page's websocket delivers names the Step execution
// that wrote it (step_execution_id, attempt), so a Step the history does not list yet shows as
// running at once, and any event other than streamed text means a Step may have ended: the
// history is read again (debounced) while the tab is shown, or once when it is shown next.
// A Step writes its events just before it commits, so a read right after its last event may
// not list it yet: while Steps seen in events are missing, the read is repeated a few times
// with growing delays (CATCH_UP_DELAYS_MS), then waits for the next event.
//
// Subagents (issue 29): a CallSubagent Step carries a collapsed "Steps of the subagent
// session …" group; opening it reads that child session's own history (and its children, from
// the sessions index's ?parent=), so a child's child nests again, at most
// TIMELINE_NESTING_LIMIT levels deep.
//
// The tabs follow the WAI-ARIA tabs pattern: role tablist / tab / tabpanel, the selected tab
// in the Tab order, Left / Right / Home / End move between tabs and select them.

import { subagentAgent, subagentGroupLabel } from "./activity.mjs";
import { api } from "./api.mjs";
import { clockTime, el } from "./dom.mjs";
import { sessionApiPath, sessionPagePath, sessionsApiPath } from "./urls.mjs";

const REREAD_DEBOUNCE_MS = 300;
const CATCH_UP_DELAYS_MS = [300, 700, 1500, 3000];
/** Events that stream text: a Step that writes them is still running. */
const STREAMING = new Set(["text_delta", "reasoning_delta", "tool_progress", "tool_log"]);

/** What a Step is, for people: [label, what it belongs to ("model" | "tool" | "approval" | "")]. */
const STEP_KINDS = {
  StartAgentSession: ["Session start", ""],
  AwaitUserMessage: ["Wait for a message", ""],
  RunModel: ["Model call", "model"],
  CompactContext: ["Context compaction", "model"],
  AwaitToolApproval: ["Approval", "approval"],
  CallTool: ["Tool call", "tool"],
  CallSingleAttemptTool: ["Tool call (one attempt)", "tool"],
  RecordToolFailure: ["Tool failure recorded", "tool"],
  RecordToolOutcomeUnknown: ["Tool outcome unknown", "tool"],
  DurableWait: ["Durable wait", "tool"],
  AwaitUserInput: ["Question", "tool"],
  ResumeTurn: ["Resume the turn", ""],
  RecordTurnFailure: ["Turn failure recorded", ""],
  CallSubagent: ["Subagent call", "tool"],
  FinishSubagentSession: ["Subagent result", ""],
};

/** How many levels of children of children the Timeline nests. */
export const TIMELINE_NESTING_LIMIT = 5;

/**
 * The children of session `sessionId` from the sessions index, by the tool call that started
 * each: Map(tool_call_id -> {id, title, agent}).
 */
async function childrenByCall(sessionId) {
  const page = await api(`${sessionsApiPath}?parent=${encodeURIComponent(sessionId)}&limit=100`);
  const found = new Map();
  for (const row of (Array.isArray(page) ? page : page?.results) ?? []) {
    if (row?.parent_tool_call_id) found.set(row.parent_tool_call_id, { id: row.id, title: row.title ?? "", agent: row.agent ?? "" });
  }
  return found;
}

/** The Step items of `steps`: `belongsTo(step)` says whose call it is, `nestFor(step)` gives
 * the nested child group of a CallSubagent Step (or null). */
function stepItems(steps, { belongsTo, nestFor }) {
  return steps.map((step) => {
    const [name, kind] = STEP_KINDS[step.stepType] ?? [step.stepType, ""];
    // A model Step is the model call itself: its number is the call's.
    const label = kind === "model" ? `${name} #${step.id.replace(/^\D+-/, "")}` : name;
    const belongs = belongsTo(step);
    const item = el(
      "li",
      { class: "timeline-step", dataset: { status: step.status, step: step.id } },
      el(
        "div",
        { class: "timeline-step-head" },
        el("strong", { class: "timeline-step-kind" }, label),
        el("code", { class: "timeline-step-id" }, step.id),
        el("span", { class: `badge timeline-status timeline-status-${step.status}` }, STATUS_TEXT[step.status]),
      ),
      belongs ? el("p", { class: "timeline-belongs small" }, `For ${belongs}`) : null,
    );
    if (step.methods.length) item.append(el("ul", { class: "timeline-methods small" }, step.methods.map((entry) => methodLine(entry, step))));
    else item.append(el("p", { class: "timeline-methods small muted" }, `Attempt ${step.attempt ?? 1} running`));
    const nested = nestFor(step);
    if (nested) item.append(nested);
    return item;
  });
}

/** "tool call agent__demo (call_1)" or "approval of …" for a Step with a tool call. */
function callText(step, name) {
  const [, kind] = STEP_KINDS[step.stepType] ?? ["", ""];
  if (!step.toolCallId) return "";
  const call = name ? `${name} (${step.toolCallId})` : step.toolCallId;
  return kind === "approval" ? `approval of ${call}` : `tool call ${call}`;
}

/**
 * One subagent call's child session in the Timeline: a link to its page and a collapsed
 * <details> of its Steps, read when opened (again on every opening, as the child may still
 * run); its own subagent calls nest the same way up to TIMELINE_NESTING_LIMIT levels.
 */
export class SubagentSteps {
  constructor({ child, depth = 1 }) {
    this.child = child;
    this.depth = depth;
    this.nested = new Map(); // grandchild ID -> SubagentSteps
    this.children = new Map();
    const toolName = child.agent ? `agent__${child.agent}` : "";
    const label = subagentGroupLabel({ toolName, title: child.title, childId: child.id });
    this.state = el("p", { class: "timeline-subagent-state small muted", role: "status" });
    this.list = el("ol", { class: "timeline-list", "aria-label": label });
    const agent = subagentAgent(toolName);
    this.details = el("details", { class: "timeline-subagent", dataset: { child: child.id } }, el("summary", {}, `Steps of the ${agent} session`, child.title ? `: ${child.title}` : ""), this.state, this.list);
    this.details.addEventListener("toggle", () => {
      if (this.details.open) this.read();
    });
    this.node = el("div", { class: "timeline-subagent-group" }, el("a", { class: "small", href: sessionPagePath(child.id) }, `Open the ${agent} session`), this.details);
  }

  async read() {
    if (this.reading) return;
    if (!this.list.children.length) this.state.textContent = "Reading the subagent's Steps…";
    try {
      this.reading = true;
      const [entries, children] = await Promise.all([api(`${sessionApiPath(this.child.id)}history/`), childrenByCall(this.child.id)]);
      this.children = children;
      const steps = groupSteps(entries);
      // Only some Steps record their call's tool (approvals): the others take it from them.
      const names = new Map(steps.filter((step) => step.toolCallId && step.toolName).map((step) => [step.toolCallId, step.toolName]));
      const agentTool = (id) => (this.children.get(id)?.agent ? `agent__${this.children.get(id).agent}` : null);
      this.list.replaceChildren(...stepItems(steps, {
        belongsTo: (step) => callText(step, names.get(step.toolCallId) ?? agentTool(step.toolCallId)),
        nestFor: (step) => nestedSteps(step, this.children, this.nested, this.depth + 1),
      }));
      this.state.textContent = steps.length ? `${steps.length} Step${steps.length === 1 ? "" : "s"}` : "No Step has run yet.";
    } catch (error) {
      this.state.textContent = `The subagent's Steps could not be read: ${error.message}`;
    } finally {
      this.reading = false;
    }
  }
}

/** The nested group of a CallSubagent `step` whose child `children` names (kept in `made`
 * across renders, so an opened group stays open), or null. */
function nestedSteps(step, children, made, depth) {
  if (step.stepType !== "CallSubagent" || depth > TIMELINE_NESTING_LIMIT) return null;
  const child = children.get(step.toolCallId);
  if (!child) return null;
  let group = made.get(child.id);
  if (!group) {
    group = new SubagentSteps({ child, depth });
    made.set(child.id, group);
  }
  return group.node;
}

/** "0.42 s", "12 s", "3 min 05 s". */
export function durationText(seconds) {
  const value = Math.max(0, Number(seconds) || 0);
  if (value < 10) return `${value.toFixed(2)} s`;
  if (value < 60) return `${Math.round(value)} s`;
  const minutes = Math.floor(value / 60);
  return `${minutes} min ${String(Math.round(value % 60)).padStart(2, "0")} s`;
}

/** The Step statuses an execute method's recorded `outcome` gives (see /history/). */
const OUTCOME_STATUSES = new Set(["failed", "cancelled", "approved", "rejected", "withdrawn", "expired"]);

/**
 * Group /history/ entries (one per ended method) into Steps, oldest first:
 * [{id, stepType, toolCallId, toolName, status, waitStart, waitEnd, methods: [entry]}].
 * `status` is "completed", "failed", "running", "waiting" (its wait_for ended and nothing
 * ended the wait yet), or what the Step recorded its ending meant (`outcome`: "cancelled",
 * "approved", "rejected", "withdrawn", "expired", or "failed" for a model call the provider
 * refused). `waitStart` / `waitEnd` (Dates or null) bound the time the Step really waited:
 * from its wait_for's start to the start of the execute method that the ended wait ran.
 * `running` maps the step_execution_id of Steps seen in events to their highest attempt; those
 * the history does not list yet (or lists only their wait_for) are "running".
 */
export function groupSteps(entries, running = new Map()) {
  const steps = new Map();
  for (const entry of entries) {
    let step = steps.get(entry.step_execution_id);
    if (!step) {
      step = { id: entry.step_execution_id, stepType: entry.step_type, toolCallId: null, toolName: null, status: "completed", waitStart: null, waitEnd: null, methods: [] };
      steps.set(step.id, step);
    }
    step.methods.push(entry);
    step.toolCallId = step.toolCallId ?? entry.tool_call_id ?? null;
    step.toolName = step.toolName ?? entry.tool_name ?? null;
    if (entry.status === "failed") step.status = "failed";
    else if (OUTCOME_STATUSES.has(entry.outcome)) step.status = entry.outcome;
  }
  for (const step of steps.values()) {
    const wait = step.methods.find((entry) => entry.method === "wait_for");
    const execute = step.methods.find((entry) => entry.method === "execute");
    if (wait?.started_at) {
      step.waitStart = new Date(wait.started_at);
      if (execute?.started_at) step.waitEnd = new Date(execute.started_at);
    }
    if (execute || step.status === "failed") continue;
    // A completed wait_for is followed by the execute method once the wait ends: a Step seen
    // in events runs it now; any other still waits.
    step.status = running.has(step.id) ? "running" : "waiting";
  }
  for (const [id, attempt] of running) {
    if (steps.has(id)) continue;
    const stepType = id.replace(/-\d+$/, "");
    steps.set(id, { id, stepType, toolCallId: null, toolName: null, status: "running", waitStart: null, waitEnd: null, methods: [], attempt });
  }
  return [...steps.values()];
}

/** A method's line: "Run 2 attempts, from 12:00:01, ran 1.52 s" or, for the wait of `step`,
 * "Wait from 12:00:01, waited 3 min 05 s" (still "waiting" while nothing ended it). */
function methodLine(entry, step) {
  const attempts = entry.final_attempt === 1 ? "1 attempt" : `${entry.final_attempt} attempts`;
  const started = entry.started_at ? `, from ${clockTime(new Date(entry.started_at))}` : "";
  const status = entry.status === "failed" ? ", failed" : "";
  let took = `ran ${durationText(entry.duration_seconds)}`;
  if (entry.method === "wait_for" && entry.status !== "failed") {
    // The wait_for method only names what to wait for; the wait lasts until the execute
    // method starts.
    if (step.waitEnd) took = `waited ${durationText((step.waitEnd - step.waitStart) / 1000)}`;
    else if (step.status === "waiting") took = "waiting";
    else took = "wait ended";
  }
  const line = el("li", { class: "timeline-method", dataset: { method: entry.method, status: entry.status } },
    el("span", { class: "timeline-method-name" }, entry.method === "wait_for" ? "Wait" : "Run"),
    ` ${attempts}${started}, ${took}${status}`);
  if (entry.error) {
    const attempt = entry.failed_attempt ? `Attempt ${entry.failed_attempt} failed: ` : "Failed: ";
    line.append(el("p", { class: "timeline-error" }, el("strong", {}, attempt), entry.error));
  }
  const outcome = outcomeText(entry);
  if (outcome) {
    const failed = entry.outcome === "failed";
    line.append(el("p", { class: failed ? "timeline-error" : "timeline-outcome" }, el("strong", {}, `${outcome.label}: `), outcome.detail));
  }
  return line;
}

/** The lead-in of an execute method's `outcome_detail`. */
const OUTCOME_LABELS = { failed: "Failed", rejected: "Rejected", withdrawn: "Withdrawn", expired: "Expired" };

/**
 * An execute method's outcome as people read it: `{label, detail}` ("Withdrawn", "the user
 * cancelled the turn."), or null without an `outcome_detail`. A detail that already starts
 * with its label ("Withdrawn: the user cancelled the turn.") loses it, so it is not said twice.
 */
export function outcomeText(entry) {
  if (!entry.outcome_detail) return null;
  const label = OUTCOME_LABELS[entry.outcome] ?? "Ended";
  let detail = String(entry.outcome_detail);
  const prefix = `${label}:`;
  if (detail.slice(0, prefix.length).toLowerCase() === prefix.toLowerCase()) detail = detail.slice(prefix.length).trimStart();
  return { label, detail };
}

const STATUS_TEXT = {
  completed: "completed",
  failed: "failed",
  running: "running",
  waiting: "waiting",
  cancelled: "cancelled",
  approved: "approved",
  rejected: "rejected",
  withdrawn: "withdrawn",
  expired: "expired",
};

/** The Timeline tab of one chat page. */
export class Timeline {
  /**
   * @param {object} options
   * @param {string} options.sessionId the session's ID (its subagent children are read by it)
   * @param {string} options.historyPath the session's /history/ API path
   * @param {HTMLElement} options.tablist the role=tablist element
   * @param {HTMLElement} options.panel the Timeline tabpanel
   * @param {(id: string) => string | undefined} options.toolName a tool call's tool, if known
   */
  constructor({ sessionId, historyPath, tablist, panel, toolName }) {
    this.sessionId = sessionId;
    this.historyPath = historyPath;
    this.children = new Map(); // tool_call_id -> this session's child {id, title, agent}
    this.nested = new Map(); // child ID -> SubagentSteps
    this.tablist = tablist;
    this.panel = panel;
    this.list = panel.querySelector(".timeline-list");
    this.state = panel.querySelector(".timeline-state");
    this.toolName = toolName;
    this.running = new Map(); // step_execution_id -> highest attempt seen in events
    this.toolNames = new Map(); // tool_call_id -> tool name, from events
    this.entries = null; // the last /history/ answer
    this.stale = true;
    this.reading = null;
    this.debounce = null;
    this.catchUps = 0; // catch-up reads since the last event
    this.tabs = [...tablist.querySelectorAll('[role="tab"]')];
    tablist.addEventListener("click", (event) => {
      const tab = event.target.closest('[role="tab"]');
      if (tab) this.select(tab);
    });
    tablist.addEventListener("keydown", (event) => this.onKey(event));
  }

  get shown() {
    return !this.panel.hidden;
  }

  /** Select `tab`, show its panel and hide the others. */
  select(tab, { focus = false } = {}) {
    for (const other of this.tabs) {
      const selected = other === tab;
      other.setAttribute("aria-selected", String(selected));
      other.tabIndex = selected ? 0 : -1;
      document.getElementById(other.getAttribute("aria-controls")).hidden = !selected;
    }
    if (focus) tab.focus();
    if (this.shown && this.stale) this.read();
  }

  onKey(event) {
    const index = this.tabs.indexOf(document.activeElement);
    if (index < 0) return;
    const last = this.tabs.length - 1;
    const next = { ArrowRight: index === last ? 0 : index + 1, ArrowLeft: index === 0 ? last : index - 1, Home: 0, End: last }[event.key];
    if (next === undefined) return;
    event.preventDefault();
    this.select(this.tabs[next], { focus: true });
  }

  /** Take what a websocket event says about Steps (every event, streamed text included). */
  onEvent(event) {
    if (event.data?.tool_call_id && event.data?.tool_name) this.toolNames.set(event.data.tool_call_id, event.data.tool_name);
    const id = event.step_execution_id;
    const known = this.running.get(id);
    if (id && Number.isInteger(event.attempt) && event.attempt > 0 && (known === undefined || event.attempt > known)) {
      this.running.set(id, event.attempt);
      if (this.shown && this.entries) this.render();
    }
    if (STREAMING.has(event.type)) return;
    this.stale = true;
    this.catchUps = 0;
    if (!this.shown || this.debounce) return;
    this.debounce = setTimeout(() => {
      this.debounce = null;
      this.read();
    }, REREAD_DEBOUNCE_MS);
  }

  /** Read the history now (one read at a time; a request during a read runs once after it). */
  async read() {
    if (this.reading) {
      this.again = true;
      return;
    }
    this.stale = false;
    if (!this.entries) this.state.textContent = "Reading the session's Steps…";
    this.reading = api(this.historyPath);
    try {
      this.entries = await this.reading;
      await this.readChildren();
      this.render();
      this.catchUp();
    } catch (error) {
      this.state.textContent = `The Steps could not be read: ${error.message}`;
      this.stale = true;
    } finally {
      this.reading = null;
    }
    if (this.again) {
      this.again = false;
      await this.read();
    }
  }

  /** Read this session's children when a subagent call's child is not known yet (its index
   * row is written before the call's Step starts it); a failed read nests nothing. */
  async readChildren() {
    const unknown = (this.entries ?? []).some((entry) => entry.step_type === "CallSubagent" && entry.tool_call_id && !this.children.has(entry.tool_call_id));
    if (!unknown || !this.sessionId) return;
    try {
      this.children = await childrenByCall(this.sessionId);
    } catch {
      // The Steps show without their children.
    }
  }

  /** Read again soon while a Step seen in events has not ended in the history read. */
  catchUp() {
    const ended = new Set(this.entries.filter((entry) => entry.method === "execute" || entry.status === "failed").map((entry) => entry.step_execution_id));
    const missing = [...this.running.keys()].some((id) => !ended.has(id));
    if (!missing || this.catchUps >= CATCH_UP_DELAYS_MS.length || this.debounce) return;
    const delay = CATCH_UP_DELAYS_MS[this.catchUps];
    this.catchUps += 1;
    this.debounce = setTimeout(() => {
      this.debounce = null;
      if (this.shown) this.read();
      else this.stale = true;
    }, delay);
  }

  /** The tool call or approval a Step belongs to, in words ("" for the others). */
  belongsTo(step) {
    if (!step.toolCallId) return "";
    const child = this.children.get(step.toolCallId);
    const name = this.toolName(step.toolCallId) ?? this.toolNames.get(step.toolCallId) ?? step.toolName ?? (child?.agent ? `agent__${child.agent}` : null);
    return callText(step, name);
  }

  render() {
    const steps = groupSteps(this.entries ?? [], this.running);
    this.list.replaceChildren(...stepItems(steps, {
      belongsTo: (step) => this.belongsTo(step),
      nestFor: (step) => nestedSteps(step, this.children, this.nested, 1),
    }));
    this.state.textContent = steps.length ? `${steps.length} Step${steps.length === 1 ? "" : "s"}` : "No Step has run yet.";
  }
}
