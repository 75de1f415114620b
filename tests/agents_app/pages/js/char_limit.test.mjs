// Tests of agents_app/static/agents_app/char_limit.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { characterCount, overLimitMessage } from "../../../../agents_app/static/agents_app/char_limit.mjs";

const box = (value, limit = "5") => ({ value, dataset: { maxChars: limit } });

test("characters are counted as the API counts them: code points, not UTF-16 units", () => {
  assert.equal(characterCount("abc"), 3);
  assert.equal(characterCount("😀😀"), 2);
  assert.equal("😀😀".length, 4);
  assert.equal(characterCount("e\u0301"), 2); // a combining accent is its own code point
});

test("a text at the limit is accepted and one past it is refused with the excess", () => {
  assert.equal(overLimitMessage(box("😀😀😀😀😀")), "");
  assert.equal(
    overLimitMessage(box("😀😀😀😀😀😀😀")),
    "The message is 2 characters over the limit of 5; shorten it to send. Nothing was sent.",
  );
});

test("a box without a limit refuses nothing", () => {
  assert.equal(overLimitMessage(box("x".repeat(10), "")), "");
});
