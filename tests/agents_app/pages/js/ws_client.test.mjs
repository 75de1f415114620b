// Tests of agents_app/static/agents_app/ws_client.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  backoffDelay,
  REFUSAL_CLOSE_CODES,
  ResumableSocket,
  urlWithAfter,
  websocketUrl,
} from "../../../../agents_app/static/agents_app/ws_client.mjs";

/** A scripted stand-in for the browser's WebSocket; every instance is recorded. */
function fakeSockets() {
  const made = [];
  class FakeSocket {
    constructor(url) {
      this.url = url;
      this.closedWith = null;
      made.push(this);
    }
    close(code) {
      this.closedWith = code;
    }
    open() {
      this.onopen?.({});
    }
    send(frame) {
      this.onmessage?.({ data: typeof frame === "string" ? frame : JSON.stringify(frame) });
    }
    drop(code = 1006) {
      this.onclose?.({ code });
    }
  }
  return { FakeSocket, made };
}

/** Timers that run only when the test says so. */
function manualTimers() {
  const pending = new Map();
  let next = 1;
  return {
    setTimer(callback, delay) {
      const handle = next++;
      pending.set(handle, { callback, delay });
      return handle;
    },
    clearTimer(handle) {
      pending.delete(handle);
    },
    delays() {
      return [...pending.values()].map((entry) => entry.delay);
    },
    runAll() {
      const due = [...pending.values()];
      pending.clear();
      for (const entry of due) entry.callback();
    },
    get size() {
      return pending.size;
    },
  };
}

function eventFrame(token, type = "text_delta", text = token) {
  return {
    type: "event",
    token,
    event: { type, turn_id: "turn-1", step_execution_id: "s", attempt: 1, data: { text } },
  };
}

function build(options = {}) {
  const { FakeSocket, made } = fakeSockets();
  const timers = manualTimers();
  const seen = { events: [], states: [], opens: [], snapshots: 0, frames: [] };
  const client = new ResumableSocket({
    url: "ws://host/ws/sessions/ses_1/events/",
    WebSocketImpl: FakeSocket,
    setTimer: timers.setTimer,
    clearTimer: timers.clearTimer,
    random: () => 0.5,
    onEvent: (frame) => seen.events.push(frame.token),
    onSnapshotRequired: () => (seen.snapshots += 1),
    onFrame: (frame) => seen.frames.push(frame),
    onOpen: (info) => seen.opens.push(info.reconnected),
    onStateChange: (state) => seen.states.push(state),
    ...options,
  });
  return { client, made, timers, seen };
}

test("urls carry the token after which to resume", () => {
  assert.equal(urlWithAfter("ws://h/ws/x/", ""), "ws://h/ws/x/");
  assert.equal(urlWithAfter("ws://h/ws/x/", "a b/c"), "ws://h/ws/x/?after=a%20b%2Fc");
  assert.equal(urlWithAfter("ws://h/ws/x/?k=1", "t"), "ws://h/ws/x/?k=1&after=t");
  assert.equal(websocketUrl("/ws/x/", { protocol: "https:", host: "e.org" }), "wss://e.org/ws/x/");
  assert.equal(websocketUrl("/ws/x/", { protocol: "http:", host: "h:8" }), "ws://h:8/ws/x/");
});

test("backoff doubles from the minimum, is capped and jittered", () => {
  const fixed = { minDelay: 500, maxDelay: 10000, random: () => 1 };
  assert.deepEqual([0, 1, 2, 3, 4, 5, 6].map((n) => backoffDelay(n, fixed)),
    [500, 1000, 2000, 4000, 8000, 10000, 10000]);
  assert.equal(backoffDelay(0, { ...fixed, random: () => 0 }), 250);
});

test("the first connection starts after the given token and delivers events in order", () => {
  const { client, made, seen } = build({ after: "t0" });
  client.start();
  assert.equal(made.length, 1);
  assert.equal(made[0].url, "ws://host/ws/sessions/ses_1/events/?after=t0");
  made[0].open();
  made[0].send(eventFrame("t1"));
  made[0].send(eventFrame("t2"));
  assert.deepEqual(seen.events, ["t1", "t2"]);
  assert.equal(client.lastToken, "t2");
  assert.deepEqual(seen.opens, [false]);
  assert.deepEqual(seen.states, ["connecting", "open"]);
});

test("a dropped socket reconnects with backoff after the last delivered token", () => {
  const { client, made, timers, seen } = build();
  client.start();
  assert.equal(made[0].url, "ws://host/ws/sessions/ses_1/events/");
  made[0].open();
  made[0].send(eventFrame("t1"));
  made[0].drop(1006);
  assert.deepEqual(timers.delays(), [375]);
  timers.runAll();
  assert.equal(made[1].url, "ws://host/ws/sessions/ses_1/events/?after=t1");
  made[1].drop(1006); // refused before opening: the next wait is longer
  assert.deepEqual(timers.delays(), [750]);
  timers.runAll();
  made[2].open();
  assert.deepEqual(seen.opens, [false, true]);
  made[2].send(eventFrame("t2"));
  assert.deepEqual(seen.events, ["t1", "t2"]);
  made[2].drop(4408); // too slow: resume as well, from a reset backoff
  assert.deepEqual(timers.delays(), [375]);
});

test("a frame repeated across connections is delivered once", () => {
  const { client, made, timers, seen } = build();
  client.start();
  made[0].open();
  made[0].send(eventFrame("t1"));
  made[0].send(eventFrame("t2"));
  client.resumeFrom("t1"); // e.g. a snapshot's events_after older than what was seen
  assert.equal(made[0].closedWith, 1000);
  assert.equal(made[1].url, "ws://host/ws/sessions/ses_1/events/?after=t1");
  made[1].open();
  made[1].send(eventFrame("t2"));
  made[1].send(eventFrame("t3"));
  assert.deepEqual(seen.events, ["t1", "t2", "t3"]);
  assert.equal(timers.size, 0);
});

test("refusals stop the client without reconnecting", () => {
  for (const code of REFUSAL_CLOSE_CODES) {
    const { client, made, timers, seen } = build();
    client.start();
    made[0].drop(code);
    assert.equal(timers.size, 0);
    assert.equal(seen.states.at(-1), "refused");
    client.reconnectNow();
    assert.equal(made.length, 1);
  }
});

test("snapshot_required is reported and other frames pass through", () => {
  const { client, made, seen } = build({ after: "gone" });
  client.start();
  made[0].open();
  made[0].send({ type: "snapshot_required" });
  made[0].send(eventFrame("t9"));
  made[0].send({ type: "approvals_changed" });
  made[0].send("not json");
  assert.equal(seen.snapshots, 1);
  assert.deepEqual(seen.events, ["t9"]);
  assert.deepEqual(seen.frames, [{ type: "approvals_changed" }]);
});

test("reconnectNow skips the backoff wait but never opens a second socket", () => {
  const { client, made, timers } = build();
  client.start();
  client.reconnectNow(); // still connecting: nothing happens
  assert.equal(made.length, 1);
  made[0].open();
  made[0].drop(1006);
  assert.equal(timers.size, 1);
  client.reconnectNow();
  assert.equal(timers.size, 0);
  assert.equal(made.length, 2);
  client.reconnectNow();
  assert.equal(made.length, 2);
});

test("stop closes the socket and ignores its late callbacks", () => {
  const { client, made, timers, seen } = build();
  client.start();
  made[0].open();
  const socket = made[0];
  const onmessage = socket.onmessage;
  client.stop();
  assert.equal(socket.closedWith, 1000);
  assert.equal(socket.onmessage, null);
  onmessage?.({ data: JSON.stringify(eventFrame("late")) });
  assert.deepEqual(seen.events, []);
  assert.equal(timers.size, 0);
  assert.equal(seen.states.at(-1), "stopped");
});

test("pause drops the socket until reconnectNow, which resumes after the last token", () => {
  const { client, made, timers, seen } = build();
  client.start();
  made[0].open();
  made[0].send(eventFrame("t1"));
  client.pause();
  assert.equal(made[0].closedWith, 1000);
  assert.equal(seen.states.at(-1), "offline");
  assert.equal(timers.size, 0);
  made[0].send(eventFrame("t2")); // a late frame of the dropped socket is ignored
  assert.deepEqual(seen.events, ["t1"]);
  client.reconnectNow();
  assert.equal(made[1].url, "ws://host/ws/sessions/ses_1/events/?after=t1");
  made[1].open();
  assert.deepEqual(seen.opens, [false, true]);
});
