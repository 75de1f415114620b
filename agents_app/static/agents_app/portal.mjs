// The portal (/): pick an agent, narrow its tools, write the first message, start a session.
// POST /api/v1/sessions/ {"agent", "message"?, "plan_mode"?, "tools"?} answers 201 {"id"}; the page then
// opens /sessions/<id>/. `tools` is sent only when the person unchecked some tools.

import { api } from "./api.mjs";
import { attachCounter, overLimitMessage } from "./char_limit.mjs";
import { byId, isSendShortcut } from "./dom.mjs";
import { sessionPagePath, sessionsApiPath } from "./urls.mjs";

const form = document.getElementById("portal-form");

function showAgent(slug) {
  for (const node of document.querySelectorAll("[data-agent]")) {
    const shown = node.dataset.agent === slug;
    node.hidden = !shown;
    // A disabled fieldset keeps the hidden agents' checkboxes out of the way of keyboards.
    if (node instanceof HTMLFieldSetElement) node.disabled = !shown;
  }
}

function chosenTools(slug) {
  const set = document.querySelector(`fieldset.tool-set[data-agent="${CSS.escape(slug)}"]`);
  const boxes = set ? [...set.querySelectorAll('input[type="checkbox"][name="tools"]')] : [];
  const checked = boxes.filter((box) => box.checked).map((box) => box.value);
  return checked.length === boxes.length ? null : checked;
}

async function start(event) {
  event.preventDefault();
  const agent = byId("agent");
  const button = byId("start-session");
  const status = byId("portal-status");
  const failure = byId("portal-error");
  const refusal = overLimitMessage(byId("message"));
  if (!refusal && (!agent.value || agent.selectedOptions[0]?.disabled || button.disabled)) return;
  const body = { agent: agent.value };
  const message = byId("message").value;
  if (refusal) {
    failure.textContent = refusal;
    failure.hidden = false;
    byId("message").focus();
    return;
  }
  if (message.trim()) {
    body.message = message;
    if (byId("portal-plan").checked) body.plan_mode = true;
  }
  const tools = chosenTools(agent.value);
  if (tools !== null) body.tools = tools;
  button.disabled = true;
  failure.hidden = true;
  status.textContent = "Starting the session…";
  try {
    const session = await api(sessionsApiPath, { method: "POST", body });
    status.textContent = "Session started; opening it…";
    window.location.assign(sessionPagePath(session.id));
  } catch (error) {
    status.textContent = "";
    failure.textContent = error.message;
    failure.hidden = false;
    button.disabled = false;
  }
}

if (form) {
  const agent = byId("agent");
  showAgent(agent.value);
  agent.addEventListener("change", () => showAgent(agent.value));
  form.addEventListener("submit", start);
  attachCounter(byId("message"), { submit: byId("start-session") });
  // The button says what it will start (README: plan mode on the first message too).
  const plan = byId("portal-plan");
  const startLabel = () => {
    byId("start-session").textContent = plan.checked ? "Start session in plan mode" : "Start session";
  };
  plan.addEventListener("change", startLabel);
  startLabel();
  byId("message").addEventListener("keydown", (event) => {
    if (isSendShortcut(event)) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
}
