// Tests of agents_app/static/agents_app/message_queue.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { MessageQueue } from "../../../../agents_app/static/agents_app/message_queue.mjs";

const entry = (id, text, extra = {}) => ({ id, text, plan_mode: false, created_at: "2026-12-01T10:00:00+00:00", ...extra });

test("steered messages are listed first, then queued ones, then messages being sent", () => {
  const queue = new MessageQueue();
  const sending = queue.addSending("on its way");
  queue.apply(queue.startRead(), {
    queued: [entry("q1", "later", { plan_mode: true }), entry("q2", "even later")],
    steered: [entry("s1", "now")],
  });
  assert.deepEqual(
    queue.rows().map((item) => [item.kind, item.id, item.text, item.planMode]),
    [
      ["steered", "s1", "now", false],
      ["queued", "q1", "later", true],
      ["queued", "q2", "even later", false],
      ["sending", sending.id, "on its way", false],
    ],
  );
  assert.equal(new Set(queue.rows().map((item) => item.key)).size, 4);
  assert.equal(queue.count, 4);
});

test("an answer older than the one shown is dropped", () => {
  const queue = new MessageQueue();
  const slow = queue.startRead(); // e.g. a snapshot that takes long
  const fast = queue.startRead(); // a queue read after a delete
  assert.equal(queue.apply(fast, { queued: [] }), true);
  assert.equal(queue.apply(slow, { queued: [entry("q1", "deleted meanwhile")] }), false);
  assert.deepEqual(queue.rows(), []);
  assert.equal(queue.apply(fast, { queued: [entry("q1", "twice")] }), false);
});

test("a sent message stays listed until a read that started after its acceptance is shown", () => {
  const queue = new MessageQueue();
  const before = queue.startRead();
  const item = queue.addSending("hello");
  assert.equal(queue.rows().at(-1).confirmed, false);
  queue.confirmSending(item);
  assert.equal(queue.rows().at(-1).confirmed, true);
  // A read that started before the server accepted it may not list it yet.
  queue.apply(before, { queued: [] });
  assert.deepEqual(queue.rows().map((row) => row.text), ["hello"]);
  // A later read lists it (or a turn already took it): the local row goes.
  queue.apply(queue.startRead(), { queued: [entry("q9", "hello")] });
  assert.deepEqual(queue.rows().map((row) => [row.kind, row.text]), [["queued", "hello"]]);
});

test("a sent message whose ID a read lists is not listed twice, even by an older read", () => {
  const queue = new MessageQueue();
  const early = queue.startRead(); // started before the send, answered after it
  const item = queue.addSending("hello");
  queue.confirmSending(item, "q7");
  queue.apply(early, { queued: [entry("q7", "hello")] });
  assert.deepEqual(queue.rows().map((row) => [row.kind, row.id]), [["queued", "q7"]]);
  assert.equal(queue.summary(), "1 message waiting for the current turn.");
  assert.deepEqual(queue.sending, []);
});

test("a refused message is no longer listed, and an unconfirmed one survives reads", () => {
  const queue = new MessageQueue();
  const refused = queue.addSending("refused");
  const pending = queue.addSending("pending");
  queue.apply(queue.startRead(), {});
  queue.dropSending(refused);
  assert.deepEqual(queue.rows().map((row) => row.text), ["pending"]);
  assert.equal(pending.confirmedAt, null);
});

test("the summary counts waiting and steering messages", () => {
  const queue = new MessageQueue();
  assert.equal(queue.summary(), "No messages waiting.");
  queue.apply(queue.startRead(), { queued: [entry("q1", "a")] });
  assert.equal(queue.summary(), "1 message waiting for the current turn.");
  queue.addSending("b");
  assert.equal(queue.summary(), "2 messages waiting for the current turn.");
  queue.apply(queue.startRead(), { queued: [], steered: [entry("s1", "a")] });
  assert.equal(queue.summary(), "1 message steering the current turn, 1 waiting.");
  queue.apply(queue.startRead(), { steered: [entry("s1", "a"), entry("s2", "c")] });
  assert.equal(queue.summary(), "2 messages steering the current turn, 1 waiting.");
});

test("no turn runs: messages wait, not for the current turn", () => {
  const queue = new MessageQueue();
  queue.apply(queue.startRead(), { queued: [entry("q1", "a"), entry("q2", "b")] });
  assert.equal(queue.summary({ turnRunning: false }), "2 messages waiting.");
  assert.equal(queue.summary({ turnRunning: true }), "2 messages waiting for the current turn.");
});

test("messages a spent budget holds are counted as held, not as waiting for a turn", () => {
  const queue = new MessageQueue();
  const held = (id, text) => ({ ...entry(id, text), delivery: "pending", held_reason: "Budget reached: ..." });
  queue.apply(queue.startRead(), { queued: [held("o1", "a")] });
  assert.equal(queue.summary({ turnRunning: false }), "1 message held: a budget is spent.");
  queue.apply(queue.startRead(), { queued: [held("o1", "a"), held("o2", "b")] });
  assert.equal(queue.summary({ turnRunning: false }), "2 messages held: a budget is spent.");
  assert.equal(queue.rows()[0].heldReason, "Budget reached: ...");
  queue.apply(queue.startRead(), { queued: [entry("q1", "a"), held("o2", "b")] });
  assert.equal(queue.summary(), "1 message waiting for the current turn, 1 held: a budget is spent.");
  queue.apply(queue.startRead(), { queued: [held("o2", "b")], steered: [entry("s1", "c")] });
  assert.equal(queue.summary(), "1 message steering the current turn, 1 held: a budget is spent.");
});

test("answers without lists count as empty", () => {
  const queue = new MessageQueue();
  queue.apply(queue.startRead(), { queued: null, steered: undefined });
  assert.deepEqual(queue.rows(), []);
});

test("a message listed twice under one ID is one row, the first listing winning", () => {
  const queue = new MessageQueue();
  queue.apply(queue.startRead(), {
    queued: [entry("q1", "first"), entry("q2", "second"), entry("q1", "first")],
    steered: [entry("q2", "second")],
  });
  assert.deepEqual(
    queue.rows().map((item) => [item.kind, item.id]),
    [["steered", "q2"], ["queued", "q1"]],
  );
});
