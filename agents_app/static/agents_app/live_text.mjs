// Live text of running turns, grouped by (turn_id, step_execution_id, attempt).
//
// The worker streams `text_delta` (Response) and `reasoning_delta` (Thinking) AgentEvents.
// A Step that is retried writes its text again under a higher `attempt`; only the highest
// attempt of each Step is kept, so a retried model call never shows its stale partial text
// next to the new one (seed "Events"). Groups are listed in the order their Step first
// appeared. No DOM use, so `node --test` runs it.

/** Event types that carry live text, and the panel each one feeds. */
export const LIVE_TEXT_KINDS = Object.freeze({
  text_delta: "response",
  reasoning_delta: "thinking",
});

/** The key of a Step's text in one panel: kind, turn and Step execution. */
export function groupKey(kind, turnId, stepExecutionId) {
  return `${kind}\u0000${turnId ?? ""}\u0000${stepExecutionId ?? ""}`;
}

/**
 * Live text groups.
 *
 * A group is {key, kind, turnId, stepExecutionId, attempt, text}.
 */
export class LiveText {
  constructor() {
    this.groups = new Map();
  }

  /**
   * Apply one AgentEvent ({type, turn_id, step_execution_id, attempt, data: {text}}).
   *
   * Returns the group it changed, or null when the event is not live text or belongs to
   * an attempt older than the one shown.
   */
  apply(event) {
    const kind = LIVE_TEXT_KINDS[event?.type];
    if (!kind) return null;
    const text = typeof event.data?.text === "string" ? event.data.text : "";
    const attempt = Number.isInteger(event.attempt) ? event.attempt : 1;
    const key = groupKey(kind, event.turn_id, event.step_execution_id);
    let group = this.groups.get(key);
    if (!group) {
      group = {
        key,
        kind,
        turnId: event.turn_id ?? null,
        stepExecutionId: event.step_execution_id ?? null,
        attempt,
        text: "",
      };
      this.groups.set(key, group);
    } else if (attempt < group.attempt) {
      return null;
    } else if (attempt > group.attempt) {
      group.attempt = attempt;
      group.text = "";
    }
    group.text += text;
    return group;
  }

  /** The groups of one panel ("response" or "thinking"), oldest Step first. */
  list(kind) {
    return [...this.groups.values()].filter((group) => group.kind === kind);
  }

  /** The turns that have live text. */
  turns() {
    return new Set([...this.groups.values()].map((group) => group.turnId));
  }

  /** Drop every group of `turnId`; returns how many were dropped. */
  dropTurn(turnId) {
    return this.dropWhere((group) => group.turnId === turnId);
  }

  /** Drop the groups `predicate(group)` accepts; returns how many were dropped. */
  dropWhere(predicate) {
    let dropped = 0;
    for (const [key, group] of this.groups) {
      if (predicate(group)) {
        this.groups.delete(key);
        dropped += 1;
      }
    }
    return dropped;
  }

  /** Drop everything. */
  clear() {
    this.groups.clear();
  }

  get size() {
    return this.groups.size;
  }
}
