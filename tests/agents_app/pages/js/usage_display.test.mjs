import assert from "node:assert/strict";
import { test } from "node:test";

import { addUsd, messageUsageTitle, turnUsage, usageTitle, usdDisplay } from "../../../../agents_app/static/agents_app/usage_display.mjs";

test("costs read as the server writes them", () => {
  assert.equal(usdDisplay("0"), "$0");
  assert.equal(usdDisplay(undefined), "$0");
  assert.equal(usdDisplay("0.000045"), "$0.000045");
  assert.equal(usdDisplay("0.0000001"), "$0.0000001");
  assert.equal(usdDisplay("0.0027125"), "$0.0027125");
  assert.equal(usdDisplay(5e-7), "$0.0000005");
  assert.equal(usdDisplay("0.125"), "$0.13");
  assert.equal(usdDisplay("0.0123"), "$0.01");
  assert.equal(usdDisplay("1234.5"), "$1,234.50");
});

test("usage reads as tokens and calls", () => {
  assert.equal(usageTitle({ input_tokens: 1200, output_tokens: 300, requests: 2 }),
    "1,200 input tokens, 300 output tokens, 2 model calls");
  assert.equal(usageTitle({ input_tokens: 1, output_tokens: 1, requests: 1 }),
    "1 input tokens, 1 output tokens, 1 model call");
  assert.equal(messageUsageTitle({ input_tokens: 7, output_tokens: 4, reasoning_tokens: 2, cost_usd: "0.00005" }),
    "This reply: 7 input tokens, 4 output tokens, 2 reasoning; cost $0.00005");
  assert.equal(messageUsageTitle(undefined), "");
});

test("a turn's calls add up on its last reply", () => {
  const usage = (cost) => ({ input_tokens: 10, output_tokens: 2, requests: 1, cost_usd: cost });
  const turns = turnUsage([
    { sequence: 1, role: "user", turn_id: "turn-1", text: "hi" },
    { sequence: 2, role: "assistant", turn_id: "turn-1", usage: usage("0.25") },
    { sequence: 3, role: "tool", turn_id: "turn-1" },
    { sequence: 4, role: "assistant", turn_id: "turn-1", usage: usage("0.5") },
    { sequence: 6, role: "assistant", turn_id: "turn-2", usage: usage("1") },
    { sequence: 7, role: "assistant", turn_id: "turn-3" },
  ]);
  assert.deepEqual([...turns.keys()], ["turn-1", "turn-2"]);
  assert.deepEqual(turns.get("turn-1"), {
    usage: { input_tokens: 20, output_tokens: 4, requests: 2, cost_usd: "0.75" },
    lastSequence: 4,
  });
});

test("costs add up exactly", () => {
  assert.equal(addUsd("0.0027125", "0.00024"), "0.0029525");
  assert.equal(addUsd("0.1", "0.2"), "0.3");
  assert.equal(addUsd("0", "0"), "0");
  assert.equal(addUsd("1.5", "2.5"), "4");
  assert.equal(addUsd("0.000000000001", "12"), "12.000000000001");
});
