// The approvals dashboard (/approvals/, staff only): every pending approval with a live
// deadline countdown, Approve (optionally with edited arguments) / Reject, bulk decisions of
// the selected cards, filters by agent, tool, owner and session (kept in the URL's query), and
// the decisions (audit trail) tab. A card whose call someone else decided first stays, saying
// who and when, until dismissed.
//
// GET /api/v1/approvals/ lists pending approvals (oldest first); /ws/approvals/ sends
// {"type": "approvals_changed"} after connecting and whenever the list changes, and the page
// then reads the list again. While that socket is down the page polls every 2 s, so a new
// approval shows up within 2 s either way.

import { api } from "./api.mjs";
import { copyButton } from "./copy_button.mjs";
import { conflictText, decisionForm } from "./decision_form.mjs";
import { byId, el, prettyJson, refreshCountdowns, timeElement } from "./dom.mjs";
import { approvalsApiPath, decisionsApiPath, sessionCallPath, sessionPagePath } from "./urls.mjs";
import { ResumableSocket, websocketUrl } from "./ws_client.mjs";

const POLL_WITHOUT_SOCKET_MS = 2000;
const POLL_WITH_SOCKET_MS = 30000;
const DECISIONS_PAGE_SIZE = 25;
const FILTER_FIELDS = ["agent", "tool", "owner", "session"];
const bulkApiPath = `${approvalsApiPath}bulk/`;
// The server may have put the count in already: "(3) Approvals · dexagents".
const baseTitle = document.title.replace(/^\(\d+\) /, "");

const state = {
  socket: null,
  socketOpen: false,
  lastRead: 0,
  decisionsOffset: 0,
  decisionsLoaded: false,
  filters: filtersFromUrl(),
  selected: new Set(), // card keys ticked for a bulk decision
  settled: new Map(), // card key -> why the call no longer waits (kept on the page until dismissed)
  suggestions: Object.fromEntries(FILTER_FIELDS.map((field) => [field, new Set()])),
};

function cardKey(item) {
  return `${item.session}\u0000${item.interrupt_id}`;
}

function setAlert(text) {
  const alert = byId("approvals-alert");
  alert.textContent = text;
  alert.hidden = !text;
}

// ---------------------------------------------------------------- filters

function filtersFromUrl() {
  const params = new URLSearchParams(window.location.search);
  return Object.fromEntries(FILTER_FIELDS.map((field) => [field, params.get(field) ?? ""]));
}

function filterQuery() {
  const params = new URLSearchParams();
  for (const field of FILTER_FIELDS) {
    if (state.filters[field]) params.set(field, state.filters[field]);
  }
  return params;
}

function filtersActive() {
  return FILTER_FIELDS.some((field) => state.filters[field]);
}

function withFilters(path, extra = {}) {
  const params = filterQuery();
  for (const [name, value] of Object.entries(extra)) params.set(name, String(value));
  const query = params.toString();
  return query ? `${path}?${query}` : path;
}

function showFilters() {
  for (const field of FILTER_FIELDS) byId(`filter-${field}`).value = state.filters[field];
}

function applyFilters(filters) {
  state.filters = filters;
  state.selected.clear();
  state.decisionsOffset = 0;
  const query = filterQuery().toString();
  history.replaceState(null, "", `${window.location.pathname}${query ? `?${query}` : ""}${window.location.hash}`);
  loadPending();
  if (state.decisionsLoaded) loadDecisions();
}

/** Offer the values seen so far (agents, tools, owners, sessions) in each filter's list. */
function rememberSuggestions(rows) {
  for (const row of rows) {
    const values = { agent: row.agent, tool: row.tool_name, owner: row.owner, session: row.session };
    for (const field of FILTER_FIELDS) {
      if (values[field]) state.suggestions[field].add(values[field]);
    }
  }
  for (const field of FILTER_FIELDS) {
    const list = byId(`filter-${field}-values`);
    if (list.children.length === state.suggestions[field].size) continue;
    list.replaceChildren(...[...state.suggestions[field]].sort().map((value) => el("option", { value })));
  }
}

// ---------------------------------------------------------------- pending count

/** The number of calls waiting, in the tab, the navigation and the tab title. */
function showPendingTotal(total) {
  document.title = total ? `(${total}) ${baseTitle}` : baseTitle;
  const nav = document.getElementById("nav-pending-count");
  if (nav) {
    nav.querySelector(".count").textContent = total ? String(total) : "";
    nav.querySelector(".visually-hidden").textContent = total ? ` (${total} pending)` : "";
  }
}

// ---------------------------------------------------------------- pending

function cardNode(item) {
  const key = cardKey(item);
  const slug = key.replace(/[^A-Za-z0-9_-]/g, "_");
  const headingId = `approval-${slug}`;
  const select = el("input", { type: "checkbox", class: "select-call", "aria-label": `Select ${item.tool_name} in ${item.session_title || item.session}` });
  select.checked = state.selected.has(key);
  select.addEventListener("change", () => {
    if (select.checked) state.selected.add(key);
    else state.selected.delete(key);
    updateBulkBar();
  });
  const card = el(
    "li",
    { class: "approval-card", dataset: { key, state: item.state ?? "pending" }, "aria-labelledby": headingId },
    el(
      "header",
      {},
      el("div", { class: "card-title" }, select, el("h2", { id: headingId }, item.tool_name)),
      el("p", { class: "small" }, "Deadline ", el("span", { class: "countdown" })),
    ),
    el(
      "dl",
      {},
      el("dt", {}, "Session"),
      el("dd", {}, el("a", { href: sessionPagePath(item.session) }, item.session_title || item.session)),
      item.parent_session ? el("dt", {}, "On behalf of") : null,
      item.parent_session
        ? el("dd", { class: "on-behalf" }, el("a", { href: sessionPagePath(item.parent_session) }, item.parent_session_title || item.parent_session))
        : null,
      el("dt", {}, "Agent"),
      el("dd", {}, item.agent ?? ""),
      el("dt", {}, "Owner"),
      el("dd", {}, item.owner ?? ""),
      el("dt", {}, "Requested"),
      el("dd", {}, item.requested_at ? timeElement(item.requested_at) : "—"),
      el("dt", {}, "Call"),
      el("dd", {}, el("a", { class: "call-link", href: sessionCallPath(item.session, item.tool_call_id) }, "Open the session at this call")),
    ),
    el(
      "div",
      { class: "args-block" },
      el("p", { class: "small muted" }, "Arguments"),
      el(
        "div",
        { class: "copyable" },
        el("pre", { class: "arguments" }, prettyJson(item.arguments ?? "")),
        copyButton("Copy arguments", () => prettyJson(item.arguments ?? "")),
      ),
    ),
    decisionForm({
      sessionId: item.session,
      interruptId: item.interrupt_id,
      toolName: item.tool_name,
      argumentsText: item.arguments ?? "{}",
      onDecided: async (approved, accepted, answer) => {
        if (accepted) {
          state.selected.delete(key);
          byId("pending-status").textContent = `${approved ? "Approved" : "Rejected"} ${item.tool_name} for ${item.owner}.`;
        } else if (answer?.status === 409) {
          // Someone else decided first (or it stopped waiting): say so here, on this card.
          settle(card, conflictText(answer));
        }
        await loadPending();
        if (state.decisionsLoaded) loadDecisions();
      },
    }),
  );
  updateDeadline(card, item);
  return card;
}

/** Keep `card` on the page with `text` saying why its call no longer waits (the reviewer who
 * lost a race reads who won and when), in place of its form, until the reviewer dismisses it. */
function settle(card, text) {
  const key = card.dataset.key;
  state.settled.set(key, text);
  state.selected.delete(key);
  card.dataset.state = "settled";
  const select = card.querySelector(".select-call");
  select.checked = false;
  select.disabled = true;
  card.querySelector(".decision-form").hidden = true;
  card.querySelector(".decided-note")?.remove();
  let note = card.querySelector(".settled-note");
  if (!note) {
    const dismiss = el("button", { type: "button", class: "button-quiet" }, "Dismiss");
    dismiss.addEventListener("click", () => {
      state.settled.delete(key);
      card.remove();
      updateBulkBar();
      loadPending();
    });
    note = el("div", { class: "settled-note" }, el("p", { role: "status" }), dismiss);
    card.querySelector("header").after(note);
  }
  note.querySelector("p").textContent = text;
  updateBulkBar();
}

function updateDeadline(card, item) {
  const countdown = card.querySelector(".countdown");
  if (item.deadline) {
    countdown.dataset.deadline = item.deadline;
  } else {
    delete countdown.dataset.deadline;
    countdown.textContent = "none";
  }
  if (item.state === "expired") {
    delete countdown.dataset.deadline;
    countdown.dataset.expired = "true";
    countdown.textContent = "Expired";
  }
  // Decided while the engine or worker did not answer: the decision waits for delivery.
  const decided = item.state === "decided" && item.decision;
  card.dataset.decided = decided ? "true" : "";
  let note = card.querySelector(".decided-note");
  if (decided) {
    if (!note) {
      note = el("p", { class: "decided-note small", role: "status" });
      card.querySelector("header").after(note);
    }
    const verdict = item.decision.approved ? (item.decision.edited_arguments ? "Approved with edits" : "Approved") : "Rejected";
    note.textContent = `${verdict} by ${item.decision.decided_by}; delivery pending until a worker answers.`;
  } else if (note) {
    note.remove();
  }
}

/** Mark cards whose deadline passed as expired; they cannot be approved any more. */
function tick() {
  const list = byId("pending-list");
  refreshCountdowns(list);
  for (const card of list.children) {
    if (state.settled.has(card.dataset.key)) continue;
    const expired = card.querySelector(".countdown")?.dataset.expired === "true";
    const decided = card.dataset.decided === "true";
    card.dataset.state = decided ? "decided" : expired ? "expired" : "pending";
    const select = card.querySelector(".select-call");
    if (expired || decided) {
      for (const button of card.querySelectorAll(".decision-form button")) button.disabled = true;
      select.disabled = true;
      if (select.checked) {
        select.checked = false;
        state.selected.delete(card.dataset.key);
      }
    }
  }
  updateBulkBar();
}

function selectableCards() {
  return [...byId("pending-list").children].filter((card) => !card.querySelector(".select-call").disabled);
}

function updateBulkBar() {
  const cards = selectableCards();
  const keys = new Set(cards.map((card) => card.dataset.key));
  for (const key of [...state.selected]) {
    if (!keys.has(key)) state.selected.delete(key);
  }
  const count = state.selected.size;
  byId("bulk-bar").hidden = byId("pending-list").children.length === 0;
  byId("bulk-count").textContent = count ? `${count} selected` : "None selected";
  byId("bulk-approve").disabled = byId("bulk-reject").disabled = count === 0;
  const all = byId("bulk-select-all");
  all.checked = count > 0 && count === cards.length;
  all.indeterminate = count > 0 && count < cards.length;
  all.disabled = cards.length === 0;
}

function renderPending(items) {
  const list = byId("pending-list");
  const wanted = new Map(items.map((item) => [cardKey(item), item]));
  for (const card of [...list.children]) {
    if (!wanted.has(card.dataset.key) && !state.settled.has(card.dataset.key)) card.remove();
  }
  const present = new Map([...list.children].map((card) => [card.dataset.key, card]));
  // Cards keep their DOM node (and any typed message, edit or focus) across refreshes.
  let previous = null;
  for (const item of items) {
    let card = present.get(cardKey(item));
    if (!card) {
      card = cardNode(item);
    } else if (!state.settled.has(cardKey(item))) {
      updateDeadline(card, item);
    }
    const expected = previous ? previous.nextElementSibling : list.firstElementChild;
    if (card !== expected) list.insertBefore(card, expected);
    previous = card;
  }
  rememberSuggestions(items);
  const pending = items.filter((item) => item.state === "pending").length;
  const expired = items.filter((item) => item.state === "expired").length;
  const decided = items.filter((item) => item.state === "decided").length;
  byId("pending-count").textContent = items.length ? String(items.length) : "";
  byId("pending-status").textContent = pendingSummary({ pending, expired, decided, total: items.length, settled: settledShown(wanted) });
  tick();
}

/** How many settled cards (lost races, kept until dismissed) the list shows that the last
 * read no longer returned. */
function settledShown(wanted) {
  return [...byId("pending-list").children].filter((card) => state.settled.has(card.dataset.key) && !wanted.has(card.dataset.key)).length;
}

/** The line above the cards. With nothing left to decide it does not say "nothing waits" over
 * a settled card, which names who decided its call first. */
function pendingSummary({ pending, expired, decided, total, settled }) {
  const filtered = filtersActive() ? " matching the filters" : "";
  if (total) {
    return `${pending} waiting for a decision${filtered}${expired ? `, ${expired} expired` : ""}${decided ? `, ${decided} decided (delivery pending)` : ""}.`;
  }
  if (settled) {
    return settled === 1
      ? "The card below no longer waits for a decision; it says why."
      : `The ${settled} cards below no longer wait for a decision; each says why.`;
  }
  return `Nothing${filtered} waits for approval.`;
}

let reading = null;
let readAgain = false;

async function loadPending() {
  if (reading) {
    readAgain = true;
    return reading;
  }
  reading = (async () => {
    try {
      const items = (await api(withFilters(approvalsApiPath))) ?? [];
      renderPending(items);
      // The navigation and the title count every waiting call, whatever the filters show.
      const all = filtersActive() ? (await api(approvalsApiPath)) ?? [] : items;
      if (all !== items) rememberSuggestions(all);
      showPendingTotal(all.length);
      state.lastRead = Date.now();
      setAlert("");
    } catch (error) {
      if (error.status !== 0) setAlert(error.message);
    }
  })();
  await reading;
  reading = null;
  if (readAgain) {
    readAgain = false;
    await loadPending();
  }
}

// ---------------------------------------------------------------- bulk

async function decideSelected(approved) {
  const cards = selectableCards().filter((card) => state.selected.has(card.dataset.key));
  if (!cards.length) return;
  const items = cards.map((card) => {
    const [session, interruptId] = card.dataset.key.split("\u0000");
    return { session, interrupt_id: interruptId };
  });
  const result = byId("bulk-result");
  byId("bulk-approve").disabled = byId("bulk-reject").disabled = true;
  result.textContent = `${approved ? "Approving" : "Rejecting"} ${items.length}…`;
  const body = { items, approved };
  if (!approved && byId("bulk-message").value) body.rejection_message = byId("bulk-message").value;
  try {
    const answer = await api(bulkApiPath, { method: "POST", body });
    const byKey = new Map(cards.map((card) => [card.dataset.key, card]));
    let done = 0;
    let refused = 0;
    for (const outcome of answer?.results ?? []) {
      const card = byKey.get(`${outcome.session}\u0000${outcome.interrupt_id}`);
      if (outcome.status === 200 || outcome.status === 202) {
        done += 1;
        state.selected.delete(card?.dataset.key);
      } else {
        refused += 1;
        if (card) settle(card, outcome.status === 409 ? conflictText(outcome) : outcome.detail || `The server answered ${outcome.status}.`);
      }
    }
    if (done) byId("bulk-message").value = "";
    const verdict = approved ? "Approved" : "Rejected";
    result.textContent = `${verdict} ${done} of ${items.length}.${refused ? ` ${refused} no longer waited for a decision; their cards say why.` : ""}`;
  } catch (error) {
    result.textContent = error.message;
  }
  await loadPending();
  if (state.decisionsLoaded) loadDecisions();
}

// ---------------------------------------------------------------- decisions

const DECISION_LABELS = { approved: "Approved", rejected: "Rejected", expired: "Expired", withdrawn: "Withdrawn" };
// Who closes an approval that no person decided.
const NO_DECIDER = { expired: "deadline", withdrawn: "turn ended" };

function argumentsCell(row) {
  if (!row.edited_arguments) return el("pre", { class: "arguments" }, prettyJson(row.arguments ?? ""));
  return el(
    "div",
    { class: "edited-arguments" },
    el("p", { class: "small" }, el("strong", {}, "Edited before approval")),
    el("p", { class: "small muted" }, "Ran with"),
    el("pre", { class: "arguments" }, prettyJson(row.edited_arguments)),
    el("details", {}, el("summary", { class: "small" }, "The model's arguments"), el("pre", { class: "arguments" }, prettyJson(row.arguments ?? ""))),
  );
}

async function loadDecisions() {
  const status = byId("decisions-status");
  try {
    const page = await api(withFilters(decisionsApiPath, { limit: DECISIONS_PAGE_SIZE, offset: state.decisionsOffset }));
    const rows = Array.isArray(page) ? page : page?.results ?? [];
    const total = Array.isArray(page) ? null : page?.count ?? null;
    rememberSuggestions(rows);
    const body = byId("decisions-body");
    body.replaceChildren(
      ...rows.map((row) =>
        el(
          "tr",
          {},
          el("td", { "data-label": "Decided" }, timeElement(row.decided_at)),
          el("td", { "data-label": "Decision" }, el("span", { class: `decision-${row.decision}` }, DECISION_LABELS[row.decision] ?? row.decision)),
          el("td", { "data-label": "Tool" }, el("code", {}, row.tool_name ?? "")),
          el("td", { "data-label": "Arguments" }, argumentsCell(row)),
          el("td", { "data-label": "By" }, row.decided_by ?? NO_DECIDER[row.decision] ?? "—"),
          el("td", { "data-label": "Message" }, row.message || "—"),
          el(
            "td",
            { "data-label": "Session" },
            // One child: on a phone the cell is a two-column grid (label, value).
            el(
              "span",
              {},
              el("a", { href: sessionPagePath(row.session) }, row.session_title || row.session),
              row.owner ? ` (${row.owner})` : "",
              row.tool_call_id ? [" · ", el("a", { href: sessionCallPath(row.session, row.tool_call_id), class: "call-link" }, "at this call")] : "",
            ),
          ),
        ),
      ),
    );
    byId("decisions-table").hidden = rows.length === 0;
    const filtered = filtersActive() ? " matching the filters" : "";
    status.textContent = rows.length
      ? `Decisions${filtered} ${state.decisionsOffset + 1}–${state.decisionsOffset + rows.length}${total !== null ? ` of ${total}` : ""}, newest first.`
      : `No decisions${filtered} yet.`;
    byId("decisions-newer").hidden = state.decisionsOffset === 0;
    byId("decisions-older").hidden = total !== null ? state.decisionsOffset + rows.length >= total : rows.length < DECISIONS_PAGE_SIZE;
    state.decisionsLoaded = true;
  } catch (error) {
    status.textContent = error.status === 404 ? "The decisions list is not available on this server yet." : error.message;
  }
}

// ---------------------------------------------------------------- tabs

const TABS = ["pending", "decisions"];

function selectTab(name, { focus = false } = {}) {
  for (const tab of TABS) {
    const selected = tab === name;
    const button = byId(`tab-${tab}`);
    button.setAttribute("aria-selected", String(selected));
    button.tabIndex = selected ? 0 : -1;
    byId(`panel-${tab}`).hidden = !selected;
    if (selected && focus) button.focus();
  }
  if (name === "decisions") loadDecisions();
  const hash = name === "decisions" ? "#decisions" : "";
  if (window.location.hash !== hash) history.replaceState(null, "", `${window.location.pathname}${window.location.search}${hash}`);
}

function onTabKey(event) {
  const index = TABS.indexOf(event.currentTarget.id.replace("tab-", ""));
  let next = null;
  if (event.key === "ArrowRight") next = TABS[(index + 1) % TABS.length];
  if (event.key === "ArrowLeft") next = TABS[(index - 1 + TABS.length) % TABS.length];
  if (event.key === "Home") next = TABS[0];
  if (event.key === "End") next = TABS.at(-1);
  if (next) {
    event.preventDefault();
    selectTab(next, { focus: true });
  }
}

// ---------------------------------------------------------------- live updates

function showLive(socketState, detail = {}) {
  const node = byId("live-state");
  state.socketOpen = socketState === "open";
  const texts = {
    connecting: detail.reconnect ? "Reconnecting…" : "Connecting…",
    open: "Live",
    waiting: "Checking every 2 s",
    offline: "Offline",
    refused: "Live updates refused; checking every 2 s",
    stopped: "",
  };
  node.textContent = texts[socketState] ?? socketState;
  node.dataset.state = { waiting: "reconnecting", offline: "closed", refused: "closed" }[socketState] ?? socketState;
}

function startSocket() {
  state.socket = new ResumableSocket({
    url: websocketUrl("/ws/approvals/"),
    onFrame: (frame) => {
      if (frame.type === "approvals_changed") {
        loadPending();
        if (state.decisionsLoaded && !byId("panel-decisions").hidden) loadDecisions();
      }
    },
    onOpen: () => loadPending(),
    onStateChange: showLive,
  });
  state.socket.start();
}

for (const tab of TABS) {
  const button = byId(`tab-${tab}`);
  button.addEventListener("click", () => selectTab(tab));
  button.addEventListener("keydown", onTabKey);
}
byId("decisions-newer").addEventListener("click", () => {
  state.decisionsOffset = Math.max(0, state.decisionsOffset - DECISIONS_PAGE_SIZE);
  loadDecisions();
});
byId("decisions-older").addEventListener("click", () => {
  state.decisionsOffset += DECISIONS_PAGE_SIZE;
  loadDecisions();
});
window.addEventListener("focus", () => loadPending());
window.addEventListener("offline", () => state.socket?.pause());
window.addEventListener("online", () => {
  loadPending();
  state.socket?.reconnectNow();
});
setInterval(tick, 1000);
setInterval(() => {
  const age = Date.now() - state.lastRead;
  if (age >= (state.socketOpen ? POLL_WITH_SOCKET_MS : POLL_WITHOUT_SOCKET_MS)) loadPending();
}, 500);

byId("approval-filters").addEventListener("submit", (event) => {
  event.preventDefault();
  applyFilters(Object.fromEntries(FILTER_FIELDS.map((field) => [field, byId(`filter-${field}`).value.trim()])));
});
byId("approval-filters").addEventListener("reset", () => {
  applyFilters(Object.fromEntries(FILTER_FIELDS.map((field) => [field, ""])));
});
byId("bulk-select-all").addEventListener("change", (event) => {
  const checked = event.currentTarget.checked;
  for (const card of selectableCards()) {
    card.querySelector(".select-call").checked = checked;
    if (checked) state.selected.add(card.dataset.key);
    else state.selected.delete(card.dataset.key);
  }
  updateBulkBar();
});
byId("bulk-approve").addEventListener("click", () => decideSelected(true));
byId("bulk-reject").addEventListener("click", () => decideSelected(false));

showFilters();
if (window.location.hash === "#decisions") selectTab("decisions");
loadPending();
startSocket();
