// Reading the chat page's session snapshot (GET /api/v1/sessions/<id>/), the page's source of
// truth: one read at a time (a request during a read runs one more read after it), or one read
// soon after a burst of events (scheduleSnapshot). Every part of the page asks for a read after
// its own writes; what a read shows is chat.mjs's to say (showSnapshotsWith), since it renders
// every part.

import { api } from "./api.mjs";
import { queue, sessionPath, showAlert, state } from "./chat_page.mjs";

const EVENT_REFRESH_DEBOUNCE_MS = 250;

const handlers = {
  show: (_snapshot, _queueRead, _snapshotRead) => {},
  gone: () => {},
};

/**
 * Set what a read does: `show(snapshot, queueRead, snapshotRead)` renders a snapshot
 * (`queueRead` is the queue model's read number, `snapshotRead` the count of reads started, so
 * late answers can be told from newer ones); `gone()` runs when the session no longer exists
 * (404).
 */
export function showSnapshotsWith({ show, gone }) {
  handlers.show = show;
  handlers.gone = gone;
}

let loading = null;
let loadAgain = false;
let debounce = null;

/** Read the snapshot now (one read at a time; a request during a read runs once after it). */
export async function loadSnapshot() {
  if (state.gone) return undefined;
  if (loading) {
    loadAgain = true;
    return loading;
  }
  loading = (async () => {
    const queueRead = queue.startRead();
    state.snapshotReads += 1;
    const snapshotRead = state.snapshotReads;
    try {
      const snapshot = await api(sessionPath);
      if (!state.gone) handlers.show(snapshot, queueRead, snapshotRead);
    } catch (error) {
      if (error.status === 404) handlers.gone();
      else if (error.status === 403 || error.status === 401) showAlert("You are no longer allowed to read this session; log in again.");
      else if (error.status !== 0) showAlert(error.message);
    }
  })();
  await loading;
  loading = null;
  if (loadAgain && !state.gone) {
    loadAgain = false;
    await loadSnapshot();
  }
}

/** Read the snapshot `delay` ms from now, unless a read is already scheduled. */
export function scheduleSnapshot(delay = EVENT_REFRESH_DEBOUNCE_MS) {
  if (debounce) return;
  debounce = setTimeout(() => {
    debounce = null;
    loadSnapshot();
  }, delay);
}

/** Forget a scheduled read (the session is gone). */
export function cancelScheduledSnapshot() {
  clearTimeout(debounce);
  debounce = null;
}
