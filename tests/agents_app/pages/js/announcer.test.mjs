// Tests of agents_app/static/agents_app/announcer.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { announce, announcement } from "../../../../agents_app/static/agents_app/announcer.mjs";

test("an announcement folds whitespace and is cut with an ellipsis", () => {
  assert.equal(announcement("  Status:\n Running   tools "), "Status: Running tools");
  const long = announcement("word ".repeat(200));
  assert.equal(long.length, 300);
  assert.ok(long.endsWith("…"));
  assert.equal(announcement(null), "");
});

test("the region is emptied, then told the sentence on the next frame", async () => {
  const region = { textContent: "Status: Waiting" };
  const frames = [];
  globalThis.requestAnimationFrame = (callback) => frames.push(callback);
  announce("Status: Waiting", region);
  assert.equal(region.textContent, "");
  frames.shift()();
  assert.equal(region.textContent, "Status: Waiting");
  announce("   ", region); // nothing to say: the region keeps what it said
  assert.equal(region.textContent, "Status: Waiting");
  assert.equal(frames.length, 0);
});

test("sentences of one frame are read together, in order", () => {
  const region = { textContent: "" };
  const frames = [];
  globalThis.requestAnimationFrame = (callback) => frames.push(callback);
  announce("Assistant: You said: hi", region);
  announce("Status: Waiting for a message", region);
  assert.equal(frames.length, 1);
  frames.shift()();
  assert.equal(region.textContent, "Assistant: You said: hi Status: Waiting for a message");
});
