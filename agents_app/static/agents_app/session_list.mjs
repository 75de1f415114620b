// The sessions list (/sessions/): filtering, sorting and paging happen on the server; this
// module shows the server's UTC times in the viewer's time zone and renames sessions in place
// (the Rename button of each of the caller's own sessions).

import { localizeTimes } from "./dom.mjs";
import { startRename } from "./session_manage.mjs";

localizeTimes(document);

document.querySelector(".sessions-table")?.addEventListener("click", (event) => {
  const button = event.target.closest(".rename-button");
  if (!button) return;
  const row = button.closest(".session-title");
  const link = row.querySelector(".session-link");
  button.hidden = true;
  startRename({
    target: link,
    sessionId: row.dataset.session,
    title: link.textContent,
    onRenamed: (title) => {
      link.textContent = title;
      button.setAttribute("aria-label", `Rename ${title}`);
    },
    onClosed: () => {
      button.hidden = false;
      button.focus();
    },
  });
});
