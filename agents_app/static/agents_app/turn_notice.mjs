// The note a session stores when a turn ended early (failed, cancelled, stopped by the turn
// guard), read for people. The note is also the model's input (dex_agents
// build_turn_failure_note): a header line, one "- <tool> <arguments> -> <status>: <outcome>"
// line per tool call of the turn (the outcome may run on over more lines, often as JSON), and
// "Do not repeat these tool calls…". People get the header in plain words and, per call, its
// tool and what happened to it, never the raw JSON meant for the model.

/** A cancelled subagent call, which may have started its child session (then stopped). */
export const SUBAGENT_CANCELLED = "cancelled; a subagent session it had started was stopped";

/** Whether a call of `tool` that ended `status` is a cancelled subagent call (issue 29: tools
 * that call a subagent are named `agent__<slug>`). */
export function subagentCancelled(tool, status) {
  return status === "cancelled" && tool.startsWith("agent__");
}

/** What each final status of a tool call means for people. */
const CALL_ENDINGS = {
  succeeded: "ran",
  failed: "ran and failed",
  rejected: "rejected; it did not run",
  cancelled: "cancelled; it did not run",
  outcome_unknown: "may or may not have run",
};
/** The built-in tools read by what they are for people, never by their internal names. */
const BUILTIN_LABELS = {
  request_user_input: "the question",
  durable_wait: "the wait",
};
const CALL_LINE = /^- (\S+) .*? -> (succeeded|failed|rejected|cancelled|outcome_unknown):(.*)$/;
/** A built-in wait or question that the turn's end cut short reports it in its result. */
const INTERRUPTED = /^\s*\{"status": "interrupted"/;
const FOR_THE_MODEL = /^Do not repeat these tool calls/;
/** The note's header lines in plain words (the first that matches wins). */
const HEADERS = [
  [/^The previous turn was cancelled before the model answered/, "This turn was cancelled before the model answered; no tool call ran."],
  [/^The previous turn was cancelled/, "This turn was cancelled. Its tool calls:"],
  [/^The previous turn failed after these tool calls ran/, "This turn failed. Its tool calls:"],
  [/^The turn was stopped after its last model call/, "The turn was stopped after its last model call. Its tool calls:"],
];

/**
 * Read a turn note.
 * @param {string} text the stored note
 * @returns {{lines: string[], calls: {tool: string, label: string, builtin: boolean,
 *   status: string, ending: string}[]}} the header lines in plain words (a guard's own reason
 *   kept as written), then the tool calls: `tool` is the name in the note, `label` what people
 *   read (a built-in's plain name such as "the question", else the tool name; `builtin` says
 *   which); a text in no known shape comes back whole as one line, without its "[Dex] " prefix.
 */
export function readTurnNotice(text) {
  const lines = [];
  const calls = [];
  for (const raw of String(text ?? "").replace(/^\[Dex\] /, "").split("\n")) {
    const line = raw.replace(/^\[Dex\] /, "").trim();
    const call = CALL_LINE.exec(line);
    if (call) {
      const [, tool, status, outcome] = call;
      const interrupted = status === "succeeded" && INTERRUPTED.test(outcome);
      // A question still open when the turn ended was asked (people saw it), then cancelled.
      const askedThenCancelled = status === "cancelled" && tool === "request_user_input";
      let ending = CALL_ENDINGS[status];
      if (interrupted) ending = "started, then interrupted";
      else if (askedThenCancelled) ending = "asked, then cancelled";
      else if (status === "succeeded" && tool === "request_user_input") ending = "asked and answered";
      else if (subagentCancelled(tool, status)) ending = SUBAGENT_CANCELLED;
      calls.push({
        tool,
        label: BUILTIN_LABELS[tool] ?? tool,
        builtin: Object.hasOwn(BUILTIN_LABELS, tool),
        status: interrupted ? "interrupted" : status,
        ending,
      });
      continue;
    }
    // Past the first call, other lines are a call's outcome or the note for the model.
    if (calls.length || !line || FOR_THE_MODEL.test(line)) continue;
    const header = HEADERS.find(([pattern]) => pattern.test(line));
    lines.push(header ? header[1] : line);
  }
  if (!lines.length && !calls.length) return { lines: [String(text ?? "").replace(/^\[Dex\] /, "")], calls };
  return { lines, calls };
}

/** The platform's own cancel and interrupt results (dex_agents _contract.py, _builtin_tools.py
 * and _steps.py), keyed "<status> <reason>", in plain words. */
const PLATFORM_RESULTS = {
  "cancelled superseded_by_steered_user_message": "Cancelled: a steered message replaced this call.",
  "cancelled turn_cancelled_by_user": "Cancelled: the turn was cancelled before this call ran.",
  "cancelled superseded_by_user_input": "Cancelled: the assistant asked a question instead.",
  "cancelled turn_stopped": "Cancelled: the turn was stopped before this call ran.",
  "interrupted superseded_by_steered_user_message": "Interrupted: a steered message ended the wait.",
  "interrupted turn_cancelled_by_user": "Interrupted: the turn was cancelled during the wait.",
};

/** Whether `value` is a plain object whose keys are exactly `keys` (in any order). */
function hasKeys(value, keys) {
  const own = Object.keys(value);
  return own.length === keys.length && keys.every((key) => Object.hasOwn(value, key));
}

/**
 * A tool message's text in plain words when it is one of the platform's own JSON results.
 * @param {string} text the tool message's text
 * @param {string} [tool] the called tool's name, when known: the built-ins' own results
 *   (durable_wait, request_user_input, write_todos) are read only for those tools
 * @returns {string | null} the sentence, or null for any other result (shown as it is)
 */
export function platformResultText(text, tool) {
  let value;
  try {
    value = JSON.parse(String(text ?? ""));
  } catch {
    return null;
  }
  if (!value || typeof value !== "object" || Array.isArray(value) || typeof value.status !== "string") return null;
  const known = PLATFORM_RESULTS[`${value.status} ${value.reason}`];
  if (known && hasKeys(value, ["status", "reason"])) return known;
  if (value.reason === "turn_stopped" && value.status === "cancelled" && hasKeys(value, ["status", "reason", "detail"])) {
    return typeof value.detail === "string" && value.detail
      ? `Cancelled: the turn was stopped before this call ran (${value.detail.replace(/\.$/, "")}).`
      : known;
  }
  if (tool === "durable_wait" && value.status === "completed" && hasKeys(value, ["status", "duration_seconds", "reason"])) {
    return `Waited ${value.duration_seconds} s${value.reason ? `: ${value.reason}` : "."}`;
  }
  if (tool === "request_user_input" && value.status === "waiting_for_user" && hasKeys(value, ["status", "prompt", "choices"])) {
    return `Asked: ${value.prompt}`;
  }
  if (tool === "write_todos" && hasKeys(value, ["status", "revision", "task_count"])) {
    if (value.status === "cleared") return "Cleared the plan.";
    if (value.status === "updated") return `Updated the plan: ${value.task_count} task${value.task_count === 1 ? "" : "s"}.`;
  }
  return null;
}
