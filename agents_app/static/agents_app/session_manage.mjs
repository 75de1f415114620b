// Rename, archive and delete of a session, shared by the chat page and the sessions list
// (issue 27, "Sessions"). Everything goes through the REST API: PATCH .../ {"title"} or
// {"archived"}, DELETE .../.

import { api } from "./api.mjs";
import { el } from "./dom.mjs";
import { sessionApiPath } from "./urls.mjs";

/** The most characters a title may have (the API refuses more). */
export const TITLE_MAX_CHARS = 200;

/**
 * Replace `target` (the element that shows the title) with a small form to rename the session
 * in place: a labelled text box, Save and Cancel. Enter saves, Escape cancels. On success
 * `onRenamed(title)` runs with the stored title and `target` comes back; a refusal shows the
 * API's message under the box and keeps it open.
 */
export function startRename({ target, sessionId, title, onRenamed, onClosed }) {
  const input = el("input", {
    type: "text", value: title, maxlength: String(TITLE_MAX_CHARS),
    "aria-label": "Session title", class: "rename-input", autocomplete: "off",
  });
  const error = el("p", { class: "field-error small", role: "alert", hidden: true });
  const save = el("button", { type: "submit", class: "button-primary small" }, "Save");
  const cancel = el("button", { type: "button", class: "button-quiet small" }, "Cancel");
  const form = el("form", { class: "rename-form", "aria-label": "Rename session" },
    input, el("span", { class: "rename-actions" }, save, cancel), error);
  const close = () => {
    form.replaceWith(target);
    target.hidden = false;
    onClosed?.();
  };
  cancel.addEventListener("click", close);
  input.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      event.preventDefault();
      close();
    }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text) {
      error.textContent = "A title cannot be blank.";
      error.hidden = false;
      input.setAttribute("aria-invalid", "true");
      return;
    }
    save.disabled = true;
    try {
      const session = await api(sessionApiPath(sessionId), { method: "PATCH", body: { title: text } });
      onRenamed(session.title);
      close();
    } catch (failure) {
      error.textContent = failure.body?.title?.join(" ") ?? failure.message;
      error.hidden = false;
      input.setAttribute("aria-invalid", "true");
    } finally {
      save.disabled = false;
    }
  });
  target.after(form);
  target.hidden = true;
  input.focus();
  input.select();
  return form;
}

/** Archive (`archived` true) or bring back the session; returns the session from the API. */
export function setArchived(sessionId, archived) {
  return api(sessionApiPath(sessionId), { method: "PATCH", body: { archived } });
}

/**
 * Open `dialog` (a <dialog> whose form has method="dialog" and a button value="delete") as a
 * modal and resolve true when the user chose to delete, false on Cancel or Escape.
 */
export function confirmDelete(dialog) {
  return confirmWith(dialog, "delete");
}

/**
 * Show the page's own modal confirmation `dialog` (a <dialog> whose <form method="dialog">
 * buttons carry values); resolves true when it closed with the button whose value is
 * `confirmValue`, false for any other button or Escape.
 */
export function confirmWith(dialog, confirmValue) {
  return new Promise((resolve) => {
    dialog.returnValue = "";
    dialog.addEventListener("close", () => resolve(dialog.returnValue === confirmValue), { once: true });
    dialog.showModal();
  });
}

/** Delete the session for good (DELETE .../); resolves when the API answered 204. */
export function deleteSession(sessionId) {
  return api(sessionApiPath(sessionId), { method: "DELETE" });
}
