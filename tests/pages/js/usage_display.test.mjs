import assert from "node:assert/strict";
import { test } from "node:test";

import { messageUsageTitle, usageTitle, usdDisplay } from "../../../agents_app/static/agents_app/usage_display.mjs";

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
