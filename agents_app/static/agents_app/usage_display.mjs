// Model usage and cost as the pages show them (issue 27): a message's own call on hover, the
// session's total in the chat header. Money arrives as a decimal string in US dollars
// ("0.000045"); it is formatted as page_selectors.usd_display formats it on the server.

import { el } from "./dom.mjs";

/** A cost in US dollars (decimal string) for display: "$1.23" from a cent (half up), else
 * the exact amount ("$0.0027125"); "$0" for nothing. */
export function usdDisplay(costUsd) {
  const amount = Number(costUsd ?? 0);
  if (!Number.isFinite(amount) || amount <= 0) return "$0";
  if (amount >= 0.01) {
    return `$${amount.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 })}`;
  }
  let text = String(costUsd);
  if (/e/i.test(text)) text = amount.toFixed(12);
  return `$${text.includes(".") ? text.replace(/0+$/, "").replace(/\.$/, "") : text}`;
}

const count = (value) => Number(value ?? 0).toLocaleString("en-US");

/** "1,200 input tokens, 300 output tokens, 2 model calls" (the server's usage_title). */
export function usageTitle(usage) {
  const calls = Number(usage?.requests ?? 0);
  return `${count(usage?.input_tokens)} input tokens, ${count(usage?.output_tokens)} output tokens, ${count(calls)} model call${calls === 1 ? "" : "s"}`;
}

/** The hover text of an assistant message: the call that produced it. */
export function messageUsageTitle(usage) {
  if (!usage) return "";
  const parts = [`${count(usage.input_tokens)} input tokens`, `${count(usage.output_tokens)} output tokens`];
  if (usage.reasoning_tokens) parts.push(`${count(usage.reasoning_tokens)} reasoning`);
  if (usage.cached_input_tokens) parts.push(`${count(usage.cached_input_tokens)} cached`);
  return `This reply: ${parts.join(", ")}; cost ${usdDisplay(usage.cost_usd)}`;
}

/** Put a session total (snapshot.usage or a usage_recorded event's "session") in `node`. */
export function showSessionUsage(node, usage) {
  if (!node || !usage) return;
  node.textContent = usdDisplay(usage.cost_usd);
  node.title = usageTitle(usage);
}

/** The small figure an assistant message shows in its header on hover (always on touch
 * screens): its call's cost and tokens, with the details as its title. */
export function messageUsageBadge(usage) {
  const tokens = Number(usage.input_tokens ?? 0) + Number(usage.output_tokens ?? 0);
  return el("span", { class: "message-usage", title: messageUsageTitle(usage) },
    `${usdDisplay(usage.cost_usd)} · ${count(tokens)} tokens`);
}
