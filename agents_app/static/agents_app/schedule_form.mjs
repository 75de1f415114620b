// The schedule form: previews the next 5 run times as the user types, through
// POST /api/v1/schedules/preview/ (the server validates; the form's submit is checked again).

import { api, ApiError, errorMessage } from "./api.mjs";

const form = document.getElementById("schedule-form");
const runsList = document.getElementById("preview-runs");
const errorLine = document.getElementById("preview-error");
let pending = null;
let timer = 0;

function request() {
  const interval = form.elements.interval_seconds.value.trim();
  return {
    cron: form.elements.cron.value,
    interval_seconds: interval === "" ? null : Number(interval),
    timezone: form.elements.timezone.value.trim() || "UTC",
  };
}

function show(runs, message) {
  runsList.replaceChildren(
    ...runs.map((run) => {
      const item = document.createElement("li");
      const time = document.createElement("time");
      time.dateTime = run;
      time.textContent = run;
      item.append(time);
      return item;
    }),
  );
  errorLine.textContent = message;
}

async function preview() {
  pending?.abort();
  pending = new AbortController();
  try {
    const body = await api(form.dataset.previewApi, {
      method: "POST", body: request(), signal: pending.signal,
    });
    show(body.next_runs, "");
  } catch (error) {
    if (error.name === "AbortError") return;
    show([], error instanceof ApiError ? errorMessage(error.status, error.body) : String(error));
  }
}

if (form) {
  for (const name of ["cron", "interval_seconds", "timezone"]) {
    form.elements[name].addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(preview, 300);
    });
  }
}
