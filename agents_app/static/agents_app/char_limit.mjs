// A character counter for a message box with a server-side length limit (the API's 100,000
// characters of `text`). The box has no `maxlength`: that attribute cuts a long paste without
// a word and counts UTF-16 units (an emoji is two), where the server counts code points. Here
// the counter appears near the limit, turns into a clear refusal past it, and the page's send
// handler asks `overLimitMessage` before it sends anything.

import { el } from "./dom.mjs";

const numberFormat = new Intl.NumberFormat();

/** Characters as the server counts them (Python's `len`: code points). */
export function characterCount(text) {
  let count = 0;
  for (const _ of text) count += 1;
  return count;
}

/** `""` while `textarea` is within its limit, else the refusal to show instead of sending. */
export function overLimitMessage(textarea) {
  const limit = Number(textarea.dataset.maxChars);
  const count = characterCount(textarea.value);
  if (!limit || count <= limit) return "";
  return `The message is ${numberFormat.format(count - limit)} characters over the limit of ${numberFormat.format(limit)}; shorten it to send. Nothing was sent.`;
}

/**
 * Attach a counter to `textarea` (which carries `data-max-chars`): shown from `showFrom` of the
 * limit on, polite to screen readers, and marked invalid past the limit. It is placed after
 * `after` (the box's send button, in the grid forms where that sits beside the box). Past the
 * limit the counter says so at once and `submit` (the form's send button, when given) is
 * disabled until the text is short enough again; a button some other code disabled is left so.
 * Returns the function that brings it up to date after the text changed other than by typing.
 */
export function attachCounter(textarea, { showFrom = 0.9, after = textarea, submit = null } = {}) {
  const limit = Number(textarea.dataset.maxChars);
  if (!limit) return null;
  const counter = el("p", { id: `${textarea.id}-count`, class: "char-count small", "aria-live": "polite", hidden: true });
  after.after(counter);
  const described = (textarea.getAttribute("aria-describedby") ?? "").split(" ").filter(Boolean);
  textarea.setAttribute("aria-describedby", [...described, counter.id].join(" "));
  let last = -1;
  const refuse = (over) => {
    if (!submit) return;
    if (over && !submit.disabled) {
      submit.disabled = true;
      submit.dataset.overLimit = "true";
    } else if (!over && submit.dataset.overLimit) {
      submit.disabled = false;
      delete submit.dataset.overLimit;
    }
  };
  const update = () => {
    // Counting is linear in the text; only the box's own length decides when it is needed.
    if (textarea.value.length < limit * showFrom) {
      if (!counter.hidden) {
        counter.hidden = true;
        textarea.removeAttribute("aria-invalid");
      }
      refuse(false);
      last = -1;
      return;
    }
    const count = characterCount(textarea.value);
    if (count === last) return;
    last = count;
    const over = count > limit;
    counter.hidden = count < limit * showFrom;
    counter.classList.toggle("char-count-over", over);
    counter.textContent = over
      ? `${numberFormat.format(count)} / ${numberFormat.format(limit)} characters: ${numberFormat.format(count - limit)} over the limit; shorten it to send`
      : `${numberFormat.format(count)} / ${numberFormat.format(limit)} characters`;
    if (over) textarea.setAttribute("aria-invalid", "true");
    else textarea.removeAttribute("aria-invalid");
    refuse(over);
  };
  textarea.addEventListener("input", update);
  update();
  return update;
}
