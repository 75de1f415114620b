// The chat page's header: the session's status badge (announced when it changes), model, cost
// and title (also the tab's), and the session's actions: Rename in place, Archive / Unarchive,
// Stop session and Delete session, each after its own confirmation where it asks for one.

import { announce } from "./announcer.mjs";
import { api } from "./api.mjs";
import { renderCancel } from "./chat_composer.mjs";
import { config, sessionPath, showAlert, state } from "./chat_page.mjs";
import { renderQueueSummary } from "./chat_queue.mjs";
import { loadSnapshot } from "./chat_snapshot.mjs";
import { byId } from "./dom.mjs";
import { statusBadge } from "./session_panels.mjs";
import { confirmDelete, confirmWith, deleteSession, setArchived, startRename } from "./session_manage.mjs";
import { sessionsPagePath } from "./urls.mjs";
import { showSessionUsage } from "./usage_display.mjs";

/** Show `status`, as the snapshot details it (a pending approval, a durable wait) unless
 * `snapshot` is null (a status hinted by live events). */
export function showStatus(status, snapshot = state.snapshot) {
  state.status = status;
  const node = byId("chat-status");
  const badge = statusBadge(status, snapshot, config.statusLabels);
  if (node.textContent !== badge.text && state.announcing) announce(`Status: ${badge.text}`);
  node.textContent = badge.text;
  node.className = `status status-${badge.key}`;
  node.dataset.status = status;
  renderCancel();
  renderQueueSummary();
}

/** Show the snapshot's status, model, title and cost, and Stop session while it can stop. */
export function renderHeader(snapshot) {
  showStatus(snapshot.status, snapshot);
  if (snapshot.model) byId("chat-model").textContent = snapshot.model;
  showTitle(snapshot.title);
  showSessionUsage(byId("chat-cost"), snapshot.usage);
  byId("chat-stop").hidden = snapshot.status === "stopped" || !(config.isOwner || config.canApprove);
}

/** Stop the session (owner or staff) after the user confirms; the Flow stops for good. */
export async function stopSession() {
  if (!(await confirmWith(byId("stop-dialog"), "stop"))) return;
  const button = byId("chat-stop");
  button.disabled = true;
  try {
    await api(`${sessionPath}stop/`, { method: "POST" });
    showAlert("");
  } catch (error) {
    showAlert(`Not stopped: ${error.message}`);
  } finally {
    button.disabled = false;
  }
  loadSnapshot();
}

/** Show `title` in the heading and the tab's title (a rename here, or one another tab or
 * client made, which the next snapshot read brings: on focus, on any event). */
function showTitle(title) {
  const heading = byId("chat-title");
  if (!title || heading.textContent === title) return;
  heading.textContent = title;
  // "<title> · dexagents", with "(n) " before it when approvals wait (approvals.mjs).
  const [, count = ""] = /^(\(\d+\) )?/.exec(document.title);
  const site = document.title.slice(document.title.lastIndexOf(" · "));
  document.title = `${count}${title}${site}`;
}

/** Rename in place: the heading becomes a text box (owner only). */
export function renameSession() {
  const heading = byId("chat-title");
  const button = byId("chat-rename");
  button.hidden = true;
  startRename({
    target: heading,
    sessionId: config.session,
    title: heading.textContent,
    onRenamed: (title) => {
      showTitle(title);
      announce(`Renamed to ${title}.`);
    },
    onClosed: () => {
      button.hidden = false;
      button.focus();
    },
  });
}

/** Archive or bring back the session (owner only); it stays usable either way. */
export async function toggleArchived() {
  const button = byId("chat-archive");
  const archived = button.dataset.archived !== "true";
  button.disabled = true;
  try {
    const session = await setArchived(config.session, archived);
    button.dataset.archived = String(session.archived);
    button.textContent = session.archived ? "Unarchive" : "Archive";
    byId("chat-archived").hidden = !session.archived;
    announce(session.archived ? "Session archived." : "Session no longer archived.");
    showAlert("");
  } catch (error) {
    showAlert(`Not changed: ${error.message}`);
  } finally {
    button.disabled = false;
  }
}

/** Delete the session after the dialog's confirmation, then go to the sessions list. */
export async function deleteThisSession() {
  if (!(await confirmDelete(byId("delete-dialog")))) return;
  const button = byId("chat-delete");
  button.disabled = true;
  try {
    state.socket?.pause();
    await deleteSession(config.session);
    window.location.assign(sessionsPagePath);
  } catch (error) {
    showAlert(`Not deleted: ${error.message}`);
    button.disabled = false;
    state.socket?.reconnectNow();
  }
}
