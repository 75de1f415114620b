// Small DOM building blocks shared by the page modules. Text always goes in as text nodes
// (never innerHTML), so nothing a model or a user wrote can become markup.

/**
 * Create an element: `el("li", {class: "x", dataset: {id: "1"}}, "text", child)`.
 * Attributes with value null, undefined or false are left out; true sets an empty one.
 */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "dataset") {
      Object.assign(node.dataset, value);
    } else if (name === "class") {
      node.className = value;
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** The element with `id`; throws when the template lacks it (a bug, not a state). */
export function byId(id) {
  const node = document.getElementById(id);
  if (!node) throw new Error(`#${id} is missing from the page`);
  return node;
}

/** Read the JSON a template put in `{{ value|json_script:id }}`. */
export function pageConfig(id) {
  return JSON.parse(byId(id).textContent);
}

const timeFormat = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
// With the zone's short name ("UTC", "GMT+1", "PST"): the API and the server-rendered pages
// speak UTC, so a time shown in the viewer's zone says which one it is.
const dateTimeFormat = new Intl.DateTimeFormat(undefined, {
  year: "numeric", month: "short", day: "numeric", hour: "numeric", minute: "2-digit", timeZoneName: "short",
});

/** "14:03:07" in the viewer's time zone. */
export function clockTime(date) {
  return timeFormat.format(date);
}

/** "1 Dec 2026, 14:03 UTC" in the viewer's time zone, named, or "" for a missing or bad value. */
export function dateTime(value) {
  if (!value) return "";
  const date = value instanceof Date ? value : new Date(value);
  return Number.isNaN(date.getTime()) ? "" : dateTimeFormat.format(date);
}

/** A `<time>` element for an ISO timestamp, shown in the viewer's time zone. */
export function timeElement(iso) {
  return el("time", { datetime: iso }, dateTime(iso) || iso || "");
}

/** Re-render every server-rendered `<time datetime>` under `root` in the viewer's zone. */
export function localizeTimes(root = document) {
  for (const node of root.querySelectorAll("time[datetime]")) {
    const shown = dateTime(node.getAttribute("datetime"));
    if (shown) {
      node.title = node.textContent.trim();
      node.textContent = shown;
    }
  }
}

/** Pretty-print JSON text for people; text that is not JSON is returned unchanged. */
export function prettyJson(text) {
  if (typeof text !== "string") return JSON.stringify(text, null, 2);
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

/** "4 min 05 s", "59 s", "2 h 03 min" for a positive number of milliseconds. */
export function duration(milliseconds) {
  const seconds = Math.max(0, Math.floor(milliseconds / 1000));
  const hours = Math.floor(seconds / 3600);
  const minutes = Math.floor((seconds % 3600) / 60);
  const rest = seconds % 60;
  if (hours) return `${hours} h ${String(minutes).padStart(2, "0")} min`;
  if (minutes) return `${minutes} min ${String(rest).padStart(2, "0")} s`;
  return `${rest} s`;
}

/** True when a Ctrl/Cmd+Enter or Alt+Enter key press should send (plain Enter is a newline). */
export function isSendShortcut(event) {
  return event.key === "Enter" && !event.isComposing && (event.ctrlKey || event.metaKey || event.altKey);
}

/**
 * Refresh every countdown under `root`: elements with `data-deadline` (ISO time) show
 * "in 4 min 05 s", or "Expired" (and `data-expired="true"`) once the deadline passed.
 * Returns how many have expired.
 */
export function refreshCountdowns(root = document, now = Date.now()) {
  let expired = 0;
  for (const node of root.querySelectorAll("[data-deadline]")) {
    const deadline = Date.parse(node.dataset.deadline);
    if (Number.isNaN(deadline)) continue;
    const left = deadline - now;
    const isExpired = left <= 0;
    node.dataset.expired = String(isExpired);
    node.textContent = isExpired ? "Expired" : `in ${duration(left)}`;
    if (isExpired) expired += 1;
  }
  return expired;
}
