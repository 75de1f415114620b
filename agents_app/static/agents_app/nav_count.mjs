// The navigation's pending-approvals count for staff, kept live on every page that shows it
// (the approvals page keeps its own, with its filters). Same mechanism as that page:
// /ws/approvals/ sends {"type": "approvals_changed"} after connecting and whenever the list
// changes, and the count is then read again from GET /api/v1/approvals/; while that socket is
// down it is read every 10 s. Loaded by base.html as its own module (the pages' policy allows
// no inline script).

import { api } from "./api.mjs";
import { approvalsApiPath } from "./urls.mjs";
import { ResumableSocket, websocketUrl } from "./ws_client.mjs";

const POLL_WITHOUT_SOCKET_MS = 10000;

/** Show `total` waiting calls in the navigation link `nav` (empty at zero). */
export function showNavCount(nav, total) {
  nav.querySelector(".count").textContent = total ? String(total) : "";
  nav.querySelector(".visually-hidden").textContent = total ? ` (${total} pending)` : "";
}

const nav = document.getElementById("nav-pending-count");
if (nav) {
  let socketOpen = false;
  let reading = null;
  let again = false; // a change arrived during a read: read once more after it
  let lastRead = 0;
  const read = () => {
    if (reading) {
      again = true;
      return reading;
    }
    reading = api(approvalsApiPath)
      .then((items) => {
        showNavCount(nav, (items ?? []).length);
        lastRead = Date.now();
      })
      .catch(() => {}) // the server-rendered count stays until a read succeeds
      .finally(() => {
        reading = null;
        if (again) {
          again = false;
          read();
        }
      });
    return reading;
  };
  const socket = new ResumableSocket({
    url: websocketUrl("/ws/approvals/"),
    onFrame: (frame) => {
      if (frame.type === "approvals_changed") read();
    },
    onOpen: () => read(),
    onStateChange: (state) => {
      socketOpen = state === "open";
    },
  });
  socket.start();
  setInterval(() => {
    if (!socketOpen && Date.now() - lastRead >= POLL_WITHOUT_SOCKET_MS) read();
  }, 1000);
  window.addEventListener("online", () => socket.reconnectNow());
}
