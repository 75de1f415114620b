// What a screen reader hears of a live page: one polite live region that is told short
// sentences (a new answer, a status change, that an answer is being written), never each
// streamed token. The region is the page's `#announcer` (visually hidden, aria-live polite).

const MAX_CHARS = 300;

/** An announcement's text: whitespace folded, cut at `MAX_CHARS` with an ellipsis. */
export function announcement(text) {
  const folded = String(text ?? "").replace(/\s+/g, " ").trim();
  return folded.length > MAX_CHARS ? `${folded.slice(0, MAX_CHARS - 1)}…` : folded;
}

/** Sentences waiting for the next frame, per region. */
const pending = new WeakMap();

/**
 * Say `text` through the live region `region` (default `#announcer`). Sentences said within
 * one frame are read together, in order (an answer and the status change it brought). The
 * region is emptied first and filled on the next frame, so the same sentence twice in a row
 * is heard twice.
 */
export function announce(text, region = document.getElementById("announcer")) {
  const said = announcement(text);
  if (!region || !said) return;
  let queued = pending.get(region);
  if (!queued) {
    queued = [];
    pending.set(region, queued);
    region.textContent = "";
    requestAnimationFrame(() => {
      pending.delete(region);
      region.textContent = queued.join(" ");
    });
  }
  queued.push(said);
}
