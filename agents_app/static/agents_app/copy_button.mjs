// A "Copy" button that puts a text on the clipboard (navigator.clipboard.writeText, which
// browsers allow on a secure origin or localhost after a click) and says for a moment whether
// it worked. The text is read when the button is pressed, so a message that grows or is read
// whole later is copied as it is then.

const FEEDBACK_MS = 2000;

/**
 * A button named `label` (its accessible name, e.g. "Copy message") showing "Copy".
 *
 * `text` is a function returning the string to copy. On success the button shows "Copied"
 * (and `data-copied="true"`), on failure "Copy failed", then "Copy" again after two seconds.
 */
export function copyButton(label, text) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "button-quiet copy-button";
  button.setAttribute("aria-label", label);
  button.title = label;
  button.textContent = "Copy";
  let reset = 0;
  button.addEventListener("click", async (event) => {
    // A Copy button inside a <summary> or a clickable row must not also toggle it.
    event.stopPropagation();
    clearTimeout(reset);
    try {
      if (!navigator.clipboard) throw new Error("no clipboard here");
      await navigator.clipboard.writeText(text());
      button.textContent = "Copied";
      button.dataset.copied = "true";
    } catch {
      button.textContent = "Copy failed";
      button.dataset.copied = "false";
    }
    reset = setTimeout(() => {
      button.textContent = "Copy";
      delete button.dataset.copied;
    }, FEEDBACK_MS);
  });
  return button;
}
