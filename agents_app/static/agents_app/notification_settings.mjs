// The staff notification settings page (/settings/notifications/): saves "Email me when a
// tool call waits for approval" with PUT /api/v1/me/notifications/ (the form's data-api) and
// says the outcome in the form's status region, which screen readers read politely.

import { api } from "./api.mjs";
import { byId } from "./dom.mjs";

const form = byId("notification-form");
const checkbox = byId("email-on-approval");
const save = byId("notification-save");
const state = byId("save-state");

/** The sentence said after saving `choice`, given the address emails go to (may be blank). */
function savedMessage(choice, email) {
  if (!choice) return "Saved: you get no approval emails.";
  if (!email) return "Saved, but no email is sent until you set an email address in admin.";
  return `Saved: approval emails go to ${email}.`;
}

function show(text, kind) {
  state.dataset.state = kind;
  state.textContent = text;
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const choice = checkbox.checked;
  save.disabled = true;
  show("Saving…", "saving");
  try {
    const answer = await api(form.dataset.api, { method: "PUT", body: { email_on_approval: choice } });
    checkbox.checked = answer.email_on_approval;
    show(savedMessage(answer.email_on_approval, answer.email), "saved");
  } catch (error) {
    show(`Not saved: ${error.message}`, "error");
  } finally {
    save.disabled = false;
  }
});
