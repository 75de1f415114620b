// When the conversation's messages were written: a time on each message (its full date on
// hover) and a separator where the viewer's calendar day changes, as chat apps show them.
// `created_at` is the API's ISO 8601 UTC time, or null for messages stored before the
// platform kept it (those get no time and never start a day).

import { el } from "./dom.mjs";

const shortTime = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });
// The hover text names the zone ("… 14:03:07 UTC"), as every other date-time on the pages.
const fullTime = new Intl.DateTimeFormat(undefined, { dateStyle: "full", timeStyle: "long" });
const longDay = new Intl.DateTimeFormat(undefined, { weekday: "long", day: "numeric", month: "long", year: "numeric" });

function parsed(iso) {
  if (!iso) return null;
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? null : date;
}

/** The viewer's calendar day of `date` as "YYYY-MM-DD" (local time). */
export function dayKey(date) {
  const month = String(date.getMonth() + 1).padStart(2, "0");
  const day = String(date.getDate()).padStart(2, "0");
  return `${date.getFullYear()}-${month}-${day}`;
}

/** "Today", "Yesterday" or "Friday, 4 December 2026" for a `dayKey` seen on `now`. */
export function dayLabel(key, now = new Date()) {
  if (key === dayKey(now)) return "Today";
  const yesterday = new Date(now);
  yesterday.setDate(now.getDate() - 1);
  if (key === dayKey(yesterday)) return "Yesterday";
  const [year, month, day] = key.split("-").map(Number);
  return longDay.format(new Date(year, month - 1, day));
}

/**
 * Where day separators go in `messages` (oldest first, each `{sequence, created_at}`):
 * a `Map` of sequence -> dayKey for each message that starts a new day, the first dated one
 * included. A message without a time stays in the day before it.
 */
export function dayBreaks(messages) {
  const breaks = new Map();
  let previous = null;
  for (const message of messages) {
    const date = parsed(message.created_at);
    if (!date) continue;
    const key = dayKey(date);
    if (key !== previous) breaks.set(message.sequence, key);
    previous = key;
  }
  return breaks;
}

/** The `<time>` for a message's header ("14:03", the full date as its title), or null. */
export function messageTime(iso) {
  const date = parsed(iso);
  if (!date) return null;
  const full = fullTime.format(date);
  return el("time", { class: "message-time", datetime: iso, title: full, "aria-label": full }, shortTime.format(date));
}

/**
 * Keep one separator `<li>` before each message of `breaks` (from `dayBreaks`) in `list`,
 * reusing the nodes in `separators` (sequence -> <li>) and removing the ones no longer wanted.
 * `nodes` maps sequence -> the message's `<li>`.
 */
export function placeDaySeparators(list, breaks, nodes, separators, now = new Date()) {
  for (const [sequence, node] of separators) {
    if (breaks.get(sequence) !== node.dataset.day || !nodes.has(sequence)) {
      node.remove();
      separators.delete(sequence);
    }
  }
  for (const [sequence, key] of breaks) {
    const message = nodes.get(sequence);
    if (!message) continue;
    let separator = separators.get(sequence);
    const label = dayLabel(key, now);
    if (!separator) {
      separator = el("li", { class: "day-separator", dataset: { day: key } }, el("span", {}, label));
      separators.set(sequence, separator);
    } else if (separator.textContent !== label) {
      separator.firstChild.textContent = label; // "Today" became "Yesterday" overnight
    }
    if (message.previousSibling !== separator) list.insertBefore(separator, message);
  }
}
