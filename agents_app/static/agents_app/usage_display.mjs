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

/** Costs carry at most 12 decimal places (the worker's pricing and UsageRecord keep 12). */
const USD_PLACES = 12;

/** `a + b` for decimal strings of US dollars, exactly (no binary floating point). */
export function addUsd(a, b) {
  const units = (text) => {
    const [whole, fraction = ""] = String(text ?? "0").split(".");
    return BigInt(whole || "0") * 10n ** BigInt(USD_PLACES) + BigInt((fraction + "0".repeat(USD_PLACES)).slice(0, USD_PLACES) || "0");
  };
  const sum = units(a) + units(b);
  const scale = 10n ** BigInt(USD_PLACES);
  const fraction = (sum % scale).toString().padStart(USD_PLACES, "0").replace(/0+$/, "");
  return fraction ? `${sum / scale}.${fraction}` : `${sum / scale}`;
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

/** Per turn, the sum of its assistant messages' usage (as AgentUsage sums it; cost exactly,
 * as a decimal string) and the sequence of its last assistant message:
 * Map(turn_id -> {usage, lastSequence}). Messages without usage are skipped. */
export function turnUsage(messages) {
  const turns = new Map();
  for (const message of messages) {
    if (message.role !== "assistant" || !message.usage || !message.turn_id) continue;
    const turn = turns.get(message.turn_id) ?? {
      usage: { input_tokens: 0, output_tokens: 0, requests: 0, cost_usd: "0" },
      lastSequence: 0,
    };
    turn.usage.input_tokens += Number(message.usage.input_tokens ?? 0);
    turn.usage.output_tokens += Number(message.usage.output_tokens ?? 0);
    turn.usage.requests += Number(message.usage.requests ?? 0);
    turn.usage.cost_usd = addUsd(turn.usage.cost_usd, message.usage.cost_usd ?? "0");
    turn.lastSequence = Math.max(turn.lastSequence, message.sequence);
    turns.set(message.turn_id, turn);
  }
  return turns;
}

/** Add each turn's total to the hover text of its last reply (nodes: Map(sequence -> li)),
 * when the turn made more than one model call. */
export function showTurnUsage(messages, nodes) {
  for (const { usage, lastSequence } of turnUsage(messages).values()) {
    const node = nodes.get(lastSequence);
    if (!node || usage.requests < 2 || node.dataset.turnUsage === String(usage.requests)) continue;
    node.dataset.turnUsage = String(usage.requests);
    const total = `This turn: ${usdDisplay(usage.cost_usd)}, ${usageTitle(usage)}`;
    const badge = node.querySelector(".message-usage");
    node.title = `${node.title}\n${total}`;
    if (badge) badge.title = `${badge.title}\n${total}`;
  }
}
