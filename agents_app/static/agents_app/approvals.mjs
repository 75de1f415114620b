// The approvals dashboard (/approvals/, staff only): every pending approval with a live
// deadline countdown and Approve / Reject, plus the decisions (audit trail) tab.
//
// GET /api/v1/approvals/ lists pending approvals (oldest first); /ws/approvals/ sends
// {"type": "approvals_changed"} after connecting and whenever the list changes, and the page
// then reads the list again. While that socket is down the page polls every 2 s, so a new
// approval shows up within 2 s either way.

import { api } from "./api.mjs";
import { decisionForm } from "./decision_form.mjs";
import { byId, el, prettyJson, refreshCountdowns, timeElement } from "./dom.mjs";
import { approvalsApiPath, decisionsApiPath, sessionPagePath } from "./urls.mjs";
import { ResumableSocket, websocketUrl } from "./ws_client.mjs";

const POLL_WITHOUT_SOCKET_MS = 2000;
const POLL_WITH_SOCKET_MS = 30000;
const DECISIONS_PAGE_SIZE = 25;

const state = {
  socket: null,
  socketOpen: false,
  lastRead: 0,
  decisionsOffset: 0,
  decisionsLoaded: false,
};

function cardKey(item) {
  return `${item.session}\u0000${item.interrupt_id}`;
}

function setAlert(text) {
  const alert = byId("approvals-alert");
  alert.textContent = text;
  alert.hidden = !text;
}

// ---------------------------------------------------------------- pending

function cardNode(item) {
  const key = cardKey(item);
  const slug = key.replace(/[^A-Za-z0-9_-]/g, "_");
  const headingId = `approval-${slug}`;
  const card = el(
    "li",
    { class: "approval-card", dataset: { key, state: item.state ?? "pending" }, "aria-labelledby": headingId },
    el(
      "header",
      {},
      el("h2", { id: headingId }, item.tool_name),
      el("p", { class: "small" }, "Deadline ", el("span", { class: "countdown" })),
    ),
    el(
      "dl",
      {},
      el("dt", {}, "Session"),
      el("dd", {}, el("a", { href: sessionPagePath(item.session) }, item.session_title || item.session)),
      el("dt", {}, "Agent"),
      el("dd", {}, item.agent ?? ""),
      el("dt", {}, "Owner"),
      el("dd", {}, item.owner ?? ""),
      el("dt", {}, "Requested"),
      el("dd", {}, item.requested_at ? timeElement(item.requested_at) : "—"),
    ),
    el(
      "div",
      { class: "args-block" },
      el("p", { class: "small muted" }, "Arguments"),
      el("pre", { class: "arguments" }, prettyJson(item.arguments ?? "")),
    ),
    decisionForm({
      sessionId: item.session,
      interruptId: item.interrupt_id,
      onDecided: async (approved, accepted) => {
        if (accepted) {
          byId("pending-status").textContent = `${approved ? "Approved" : "Rejected"} ${item.tool_name} for ${item.owner}.`;
        }
        await loadPending();
        if (state.decisionsLoaded) loadDecisions();
      },
    }),
  );
  updateDeadline(card, item);
  return card;
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
    const verdict = item.decision.approved ? "Approved" : "Rejected";
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
    const expired = card.querySelector(".countdown")?.dataset.expired === "true";
    const decided = card.dataset.decided === "true";
    card.dataset.state = decided ? "decided" : expired ? "expired" : "pending";
    for (const button of card.querySelectorAll(".decision-buttons button")) {
      if (expired || decided) button.disabled = true;
    }
  }
}

function renderPending(items) {
  const list = byId("pending-list");
  const wanted = new Map(items.map((item) => [cardKey(item), item]));
  for (const card of [...list.children]) {
    if (!wanted.has(card.dataset.key)) card.remove();
  }
  const present = new Map([...list.children].map((card) => [card.dataset.key, card]));
  // Cards keep their DOM node (and any typed message or focus) across refreshes.
  let previous = null;
  for (const item of items) {
    let card = present.get(cardKey(item));
    if (!card) {
      card = cardNode(item);
    } else {
      updateDeadline(card, item);
    }
    const expected = previous ? previous.nextElementSibling : list.firstElementChild;
    if (card !== expected) list.insertBefore(card, expected);
    previous = card;
  }
  const pending = items.filter((item) => item.state === "pending").length;
  const expired = items.filter((item) => item.state === "expired").length;
  const decided = items.filter((item) => item.state === "decided").length;
  byId("pending-count").textContent = items.length ? String(items.length) : "";
  byId("tab-pending").setAttribute("aria-label", `Pending (${items.length})`);
  byId("pending-status").textContent = items.length
    ? `${pending} waiting for a decision${expired ? `, ${expired} expired` : ""}${decided ? `, ${decided} decided (delivery pending)` : ""}.`
    : "Nothing waits for approval.";
  tick();
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
      renderPending((await api(approvalsApiPath)) ?? []);
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

// ---------------------------------------------------------------- decisions

const DECISION_LABELS = { approved: "Approved", rejected: "Rejected", expired: "Expired", withdrawn: "Withdrawn" };
// Who closes an approval that no person decided.
const NO_DECIDER = { expired: "deadline", withdrawn: "turn ended" };

async function loadDecisions() {
  const status = byId("decisions-status");
  try {
    const page = await api(`${decisionsApiPath}?limit=${DECISIONS_PAGE_SIZE}&offset=${state.decisionsOffset}`);
    const rows = Array.isArray(page) ? page : page?.results ?? [];
    const total = Array.isArray(page) ? null : page?.count ?? null;
    const body = byId("decisions-body");
    body.replaceChildren(
      ...rows.map((row) =>
        el(
          "tr",
          {},
          el("td", { "data-label": "Decided" }, timeElement(row.decided_at)),
          el("td", { "data-label": "Decision" }, el("span", { class: `decision-${row.decision}` }, DECISION_LABELS[row.decision] ?? row.decision)),
          el("td", { "data-label": "Tool" }, el("code", {}, row.tool_name ?? "")),
          el("td", { "data-label": "By" }, row.decided_by ?? NO_DECIDER[row.decision] ?? "—"),
          el("td", { "data-label": "Message" }, row.message || "—"),
          el("td", { "data-label": "Session" }, el("a", { href: sessionPagePath(row.session) }, row.session_title || row.session), row.owner ? ` (${row.owner})` : ""),
        ),
      ),
    );
    byId("decisions-table").hidden = rows.length === 0;
    status.textContent = rows.length
      ? `Decisions ${state.decisionsOffset + 1}–${state.decisionsOffset + rows.length}${total !== null ? ` of ${total}` : ""}, newest first.`
      : "No decisions yet.";
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

if (window.location.hash === "#decisions") selectTab("decisions");
loadPending();
startSocket();
