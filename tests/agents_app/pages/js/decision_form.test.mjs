// Tests of agents_app/static/agents_app/decision_form.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { conflictText, parseEdit } from "../../../../agents_app/static/agents_app/decision_form.mjs";
import { sessionCallPath } from "../../../../agents_app/static/agents_app/urls.mjs";

test("an edit that says the same as the model's arguments is no edit", () => {
  assert.deepEqual(parseEdit('{\n  "a": 1,\n  "b": "x"\n}', '{"a":1,"b":"x"}'), { edited: undefined });
});

test("a changed edit is sent as the parsed object", () => {
  assert.deepEqual(parseEdit('{"a": 2}', '{"a": 1}'), { edited: { a: 2 } });
});

test("text that is not a JSON object is refused before anything is sent", () => {
  assert.match(parseEdit("{a: 1}", "{}").error, /^The arguments are not valid JSON: /);
  assert.equal(parseEdit("[1]", "{}").error, "The arguments must be a JSON object.");
  assert.equal(parseEdit("null", "{}").error, "The arguments must be a JSON object.");
});

test("the lost race says who decided what and when", () => {
  const text = conflictText({
    detail: "Already approved by alice at 2026-12-05 08:40:12 UTC.",
    decision: { approved: true, decided_by: "alice", decided_at: "2026-12-05T08:40:12Z" },
  });
  assert.match(text, /^Already approved by alice at .*2026.*\.$/);
  // The time is the viewer's, and says which zone it is in (the API's value is UTC).
  assert.match(text, / (UTC|GMT[+-][\d:]+)\.$/);
  const rejected = conflictText({ decision: { approved: false, decided_by: "bob", decided_at: "2026-12-05T08:40:12Z" } });
  assert.match(rejected, /^Already rejected by bob at /);
});

test("a call nobody decided says why it stopped waiting", () => {
  assert.equal(conflictText({ detail: "This tool call expired: its approval deadline passed.", decision: null }), "This tool call expired: its approval deadline passed.");
  assert.equal(conflictText(null), "This call no longer waits for a decision.");
});

test("the link to a call names it in the fragment", () => {
  assert.equal(sessionCallPath("ses_1", "call 1"), "/sessions/ses_1/#call-call%201");
});
