// What an open turn of the chat page waits on, besides approvals: the agent's question
// (request_user_input: choices or free text, answered with POST .../input/), an MCP server's
// question during a tool call (the snapshot's pending_elicitations, oldest first: the server's
// form or link, Submit / Done, Decline, Cancel, posted to .../elicitations/<id>/, a 400 shown
// next to its fields; elicitation_form.mjs) and a durable wait's timer. Such a question takes
// the composer's place unless the owner chooses to write a message instead, so whether the
// composer shows is decided here too. The snapshot is re-read on their events
// (user_input_requested, user_input_answered, elicitation_requested, elicitation_closed,
// durable_wait_started: chat_live.mjs) and after every write.

import { api } from "./api.mjs";
import { overLimitMessage } from "./char_limit.mjs";
import { ownerCanSend, sessionPath, state } from "./chat_page.mjs";
import { loadSnapshot } from "./chat_snapshot.mjs";
import { byId, el, refreshCountdowns } from "./dom.mjs";
import { contentFrom, elicitationCard, fieldErrors, fieldNodes, rawValues, showFieldErrors } from "./elicitation_form.mjs";
import { questionPanel, timerCard } from "./session_panels.mjs";

const waiting = {
  question: null, // call_id of the question the panel shows
  answering: null, // call_id of an answer in flight or sent
  composeInstead: null, // call_id (or elicitation ID) the owner chose to write a message instead of
  elicitation: null, // the elicitation card the panel shows
  elicitationSending: null, // ID of the elicitation whose answer is in flight or sent
  focusComposer: false, // an answer chosen by a button was sent: the composer takes the focus
};

export function renderTimer() {
  const card = timerCard(state.snapshot?.pending_timer ?? null);
  const panel = byId("timer");
  panel.hidden = card === null;
  if (!card) return;
  panel.dataset.call = card.callId;
  const until = byId("timer-until");
  until.dateTime = card.until.toISOString();
  until.textContent = card.untilText;
  byId("timer-left").textContent = card.left;
  byId("timer-reason").textContent = card.reason ? `· ${card.reason}` : "";
}

// ---------------------------------------------------------------- question

/** Show the open question (or hide the panel); focus moves to it when a new one appears. */
export function renderQuestion() {
  const question = state.snapshot?.status === "stopped" ? null : questionPanel(state.snapshot?.pending_input);
  const panel = byId("user-input");
  const isNew = question !== null && question.callId !== waiting.question;
  waiting.question = question?.callId ?? null;
  if (!question) {
    // Focus leaves a panel that hides: give it to the composer that takes its place.
    const hadFocus = !panel.hidden && panel.contains(document.activeElement);
    panel.hidden = true;
    waiting.answering = null;
    showComposer();
    if (hadFocus) document.getElementById("composer-text")?.focus({ preventScroll: true });
    return;
  }
  panel.hidden = false;
  const form = document.getElementById("user-input-form");
  const owner = Boolean(form);
  if (isNew) {
    byId("user-input-heading").textContent = question.prompt;
    panel.dataset.call = question.callId;
    const choices = byId("user-input-choices");
    choices.replaceChildren(
      ...question.choices.map((choice) =>
        owner
          ? el("button", { type: "button", class: "input-choice", dataset: { answer: choice } }, choice)
          : el("span", { class: "input-choice input-choice-readonly" }, choice),
      ),
    );
    choices.hidden = question.freeText;
    if (form) {
      form.hidden = !question.freeText;
      byId("user-input-text").value = "";
      showAnswerError("");
      byId("user-input-state").textContent = "";
    }
  }
  const sending = waiting.answering === question.callId;
  for (const button of panel.querySelectorAll("button.input-choice")) button.disabled = sending;
  const submit = document.getElementById("user-input-submit");
  if (submit) submit.disabled = sending;
  showComposer();
  if (isNew && owner) {
    const target = question.freeText ? byId("user-input-text") : panel.querySelector("button.input-choice");
    target?.focus({ preventScroll: true });
  }
}

function showAnswerError(text) {
  const node = document.getElementById("user-input-error");
  if (!node) return;
  node.textContent = text;
  node.hidden = !text;
}

/** The composer shows when the owner may send and no question takes its place (unless the
 * owner chose to write a message instead of answering). */
export function showComposer() {
  const composer = document.getElementById("composer");
  if (!composer) return;
  const canSend = ownerCanSend();
  const asking = waiting.question !== null && waiting.composeInstead !== waiting.question;
  const eliciting = waiting.elicitation !== null && waiting.composeInstead !== waiting.elicitation.id;
  composer.hidden = state.gone || !canSend || asking || eliciting;
  if (!composer.hidden && waiting.focusComposer) {
    waiting.focusComposer = false;
    document.getElementById("composer-text")?.focus();
  }
  const alternative = document.querySelector("#user-input .input-alternative");
  if (alternative) alternative.hidden = !asking;
  const elsewhere = document.querySelector("#elicitation .input-alternative");
  if (elsewhere) elsewhere.hidden = !eliciting;
}

/** Answer the open question (POST .../input/). */
export async function answerQuestion(answer, chosen = null) {
  const callId = waiting.question;
  if (!callId || waiting.answering === callId) return;
  if (!answer.trim()) {
    showAnswerError("Write an answer first.");
    byId("user-input-text").focus();
    return;
  }
  const refusal = overLimitMessage(byId("user-input-text"));
  if (refusal) {
    showAnswerError(refusal);
    byId("user-input-text").focus();
    return;
  }
  waiting.answering = callId;
  showAnswerError("");
  renderQuestion();
  const note = byId("user-input-state");
  note.textContent = "Sending your answer…";
  try {
    await api(`${sessionPath}input/`, { method: "POST", body: { call_id: callId, answer } });
    chosen?.classList.add("input-choice-chosen");
    note.textContent = `Answer sent: ${answer}`;
    // The buttons are gone with the question: the message box is where the person goes next.
    if (chosen) waiting.focusComposer = true;
  } catch (error) {
    waiting.answering = null;
    note.textContent = "";
    showAnswerError(
      error.status === 409 ? "This question is no longer open: it was answered or withdrawn." : `Not sent: ${error.message}`,
    );
    renderQuestion();
  }
  loadSnapshot();
}

export function onChoiceClick(event) {
  const button = event.target.closest("button.input-choice");
  if (!button || button.disabled) return;
  answerQuestion(button.dataset.answer ?? button.textContent, button);
}

/** Show the composer while a question is open; the next question hides it again. */
export function composeInstead() {
  waiting.composeInstead = waiting.question;
  showComposer();
  document.getElementById("composer-text")?.focus();
}

// ---------------------------------------------------------------- questions of MCP servers

/** Show the oldest question an MCP server waits on (or hide the panel); a new one gets a
 * fresh form and the focus. */
export function renderElicitation() {
  const snapshot = state.snapshot;
  const pending = snapshot?.status === "stopped" ? [] : (snapshot?.pending_elicitations ?? []);
  const card = elicitationCard(pending[0] ?? null);
  const panel = byId("elicitation");
  const isNew = card !== null && card.id !== waiting.elicitation?.id;
  waiting.elicitation = card;
  if (!card) {
    const hadFocus = !panel.hidden && panel.contains(document.activeElement);
    panel.hidden = true;
    waiting.elicitationSending = null;
    showComposer();
    if (hadFocus) document.getElementById("composer-text")?.focus({ preventScroll: true });
    return;
  }
  panel.hidden = false;
  const form = document.getElementById("elicitation-form");
  if (isNew) {
    panel.dataset.elicitation = card.id;
    panel.dataset.mode = card.mode;
    byId("elicitation-server").textContent = card.server;
    byId("elicitation-tool").textContent = card.toolName;
    byId("elicitation-heading").textContent = card.message;
    const deadline = byId("elicitation-deadline");
    if (card.deadline) deadline.dataset.deadline = card.deadline;
    else delete deadline.dataset.deadline;
    const link = byId("elicitation-link");
    link.hidden = card.mode !== "url";
    const anchor = byId("elicitation-url");
    anchor.href = card.mode === "url" ? card.url : "about:blank";
    anchor.textContent = card.url;
    byId("elicitation-fields").replaceChildren(...fieldNodes(card.fields, "elicitation-field", { disabled: !form }));
    if (form) {
      byId("elicitation-submit").textContent = card.mode === "url" ? "Done" : "Submit";
      showElicitationError("");
      byId("elicitation-state").textContent = "";
    }
  }
  const more = pending.length - 1;
  byId("elicitation-more").textContent = more > 0 ? `${more} more question${more === 1 ? "" : "s"} wait after this one.` : "";
  refreshCountdowns(panel);
  const sending = waiting.elicitationSending === card.id;
  if (form) for (const button of form.querySelectorAll("button")) button.disabled = sending;
  showComposer();
  if (isNew && form && waiting.composeInstead !== card.id) {
    const target = form.querySelector("input, select") ?? byId("elicitation-submit");
    target.focus({ preventScroll: true });
  }
}

function showElicitationError(text) {
  const node = document.getElementById("elicitation-error");
  if (!node) return;
  node.textContent = text;
  node.hidden = !text;
}

const ELICITATION_SENT = { accept: "Answer sent.", decline: "Declined.", cancel: "Cancelled." };

/** Answer the shown question with `action` (POST .../elicitations/<id>/): `accept` sends the
 * form's values (none in URL mode). A 400 shows the server's messages next to their fields. */
export async function answerElicitation(action) {
  const card = waiting.elicitation;
  if (!card || waiting.elicitationSending === card.id) return;
  const form = byId("elicitation-form");
  const body = { action };
  if (action === "accept" && card.mode === "form") body.content = contentFrom(card.fields, rawValues(card.fields, form));
  waiting.elicitationSending = card.id;
  showElicitationError("");
  showFieldErrors(card.fields, form, { fields: {}, form: [] });
  renderElicitation();
  const note = byId("elicitation-state");
  note.textContent = "Sending…";
  try {
    await api(`${sessionPath}elicitations/${encodeURIComponent(card.id)}/`, { method: "POST", body });
    note.textContent = ELICITATION_SENT[action];
  } catch (error) {
    waiting.elicitationSending = null;
    note.textContent = "";
    renderElicitation();
    if (error.status === 400) {
      const errors = fieldErrors(card.fields, error.body);
      const first = showFieldErrors(card.fields, form, errors);
      showElicitationError(errors.form.length ? errors.form.join(" ") : "Some answers need a change: see the messages under their fields.");
      first?.focus();
    } else if (error.status === 409) {
      showElicitationError("This question no longer waits for an answer: it was answered, expired or withdrawn.");
    } else {
      showElicitationError(`Not sent: ${error.message}`);
    }
  }
  loadSnapshot();
}

export function onElicitationClick(event) {
  const button = event.target.closest("button[data-action]");
  if (!button || button.disabled) return;
  answerElicitation(button.dataset.action);
}

/** Show the composer while a server's question is open; a new question hides it again. */
export function composeInsteadOfElicitation() {
  waiting.composeInstead = waiting.elicitation?.id ?? null;
  showComposer();
  document.getElementById("composer-text")?.focus();
}

/** Refresh the timer's time left and the server question's deadline (every second). */
export function tickWaits() {
  if (state.snapshot?.pending_timer) renderTimer();
  if (waiting.elicitation) refreshCountdowns(byId("elicitation"));
}
