// The chat page's message queue without the DOM: which read to believe, what to list in which
// order, and the summary line. chat_queue.mjs renders it; tests/agents_app/pages/js/message_queue.test.mjs
// tests it.
//
// Two reads carry the queue: the session snapshot and GET /api/v1/sessions/<id>/queue/. They
// may finish out of order, so every read is numbered when it starts and an answer older than
// the one shown is dropped. Messages this page sent stay listed (as "sending") until the queue
// lists the ID the server answered with, or a read that started after the server accepted them
// has been shown: by then the queue lists them, or a turn already took them.

/** A row of the panel: `kind` is "steered", "queued" or "sending". */
function row(kind, entry) {
  return {
    key: `${kind}:${entry.id}`,
    id: entry.id,
    kind,
    text: entry.text ?? "",
    planMode: Boolean(entry.plan_mode),
    createdAt: entry.created_at ?? null,
    // "pending": kept by the platform until the engine and a worker answer.
    delivery: entry.delivery ?? "delivered",
    // Set when a spent budget holds a pending message: which budget, when it resets.
    heldReason: entry.held_reason ?? "",
  };
}

function plural(count, word) {
  return `${count} ${word}${count === 1 ? "" : "s"}`;
}

export class MessageQueue {
  constructor() {
    this.queued = [];
    this.steered = [];
    this.reads = 0; // reads started
    this.shown = 0; // the number of the read whose answer is shown
    this.sending = []; // [{id, text, planMode, confirmedAt}], oldest first
    this.sent = 0;
  }

  /** Number a read that starts now; hand the number to `apply` with its answer. */
  startRead() {
    this.reads += 1;
    return this.reads;
  }

  /**
   * Show the answer of read number `read` (`{queued, steered}` as the API lists them), unless
   * a read that started later has already been shown. Returns whether it was taken.
   */
  apply(read, { queued = [], steered = [] } = {}) {
    if (read <= this.shown) return false;
    this.shown = read;
    this.queued = Array.isArray(queued) ? queued : [];
    this.steered = Array.isArray(steered) ? steered : [];
    const listed = this.listedIds();
    this.sending = this.sending.filter(
      (item) => !listed.has(item.serverId) && (item.confirmedAt === null || read <= item.confirmedAt),
    );
    return true;
  }

  /** A message this page is sending; listed until a later read shows the queue after it. */
  addSending(text, { planMode = false } = {}) {
    this.sent += 1;
    const item = { id: `local-${this.sent}`, text, planMode, confirmedAt: null, serverId: null };
    this.sending.push(item);
    return item;
  }

  /** The server accepted `item` as `serverId`: the next read to start lists it (or shows it
   * taken), and so does any read that lists that ID. */
  confirmSending(item, serverId = null) {
    item.confirmedAt = this.reads;
    item.serverId = serverId;
  }

  /** The server refused `item`: stop listing it. */
  dropSending(item) {
    this.sending = this.sending.filter((other) => other !== item);
  }

  listedIds() {
    return new Set([...this.steered, ...this.queued].map((entry) => entry.id));
  }

  /** Messages being sent that no listed entry stands for yet. */
  unlisted() {
    const listed = this.listedIds();
    return this.sending.filter((item) => item.serverId === null || !listed.has(item.serverId));
  }

  /** Rows in the order the panel lists them: steered, queued, then messages being sent. */
  rows() {
    // One row per message ID, the first listing winning (steered before queued): an ID listed
    // twice would give two rows one key, and the rows would jump under the pointer.
    const shown = new Set();
    const once = (entry) => !shown.has(entry.id) && Boolean(shown.add(entry.id));
    return [
      ...this.steered.filter(once).map((entry) => row("steered", entry)),
      ...this.queued.filter(once).map((entry) => row("queued", entry)),
      ...this.unlisted().map((item) => ({
        ...row("sending", { id: item.id, text: item.text, plan_mode: item.planMode }),
        confirmed: item.confirmedAt !== null,
      })),
    ];
  }

  /**
   * "No messages waiting.", "2 messages waiting for the current turn." (or "2 messages
   * waiting." when `turnRunning` is false: they wait for the platform or the owner's other
   * turns), with steered messages "1 message steering the current turn, 2 waiting.", and the
   * messages a spent budget holds counted apart: "1 message held: a budget is spent." or
   * "1 message waiting for the current turn, 1 held: a budget is spent."
   */
  summary({ turnRunning = true } = {}) {
    const held = this.queued.filter((entry) => entry.held_reason).length;
    const waiting = this.queued.length + this.unlisted().length - held;
    const steering = this.steered.length;
    const heldText = held ? `held: a budget is spent` : "";
    if (!steering && !waiting) return held ? `${plural(held, "message")} ${heldText}.` : "No messages waiting.";
    const parts = [];
    if (steering) {
      parts.push(`${plural(steering, "message")} steering the current turn`);
      if (waiting) parts.push(`${waiting} waiting`);
    } else {
      parts.push(`${plural(waiting, "message")} waiting${turnRunning ? " for the current turn" : ""}`);
    }
    if (held) parts.push(`${held} ${heldText}`);
    return `${parts.join(", ")}.`;
  }

  /** How many messages the panel lists. */
  get count() {
    return this.steered.length + this.queued.length + this.unlisted().length;
  }
}
