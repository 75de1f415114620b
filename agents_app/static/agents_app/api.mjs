// Calls of the REST API from the pages: same-origin session cookie plus Django's CSRF token.

/** An API answer that was not 2xx: `status`, the parsed `body` and a sentence `message`. */
export class ApiError extends Error {
  constructor(status, body, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.body = body;
  }
}

function csrfToken() {
  return document.querySelector('meta[name="csrf-token"]')?.content ?? "";
}

/** A sentence for people from a DRF error body ({"detail"} or {"field": ["error"]}). */
export function errorMessage(status, body) {
  if (body && typeof body === "object") {
    if (typeof body.detail === "string") return body.detail;
    const parts = [];
    for (const [field, errors] of Object.entries(body)) {
      const text = Array.isArray(errors) ? errors.join(" ") : String(errors);
      parts.push(field === "non_field_errors" ? text : `${field}: ${text}`);
    }
    if (parts.length) return parts.join(" ");
  }
  if (status === 0) return "The server cannot be reached; check the connection.";
  if (status === 503) return "The engine is not reachable right now; try again shortly.";
  return `The server answered ${status}.`;
}

/**
 * Call `path` (e.g. "/api/v1/sessions/") and return the parsed JSON body.
 *
 * Throws ApiError for non-2xx answers and for network failures (status 0).
 */
export async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && method !== "HEAD") headers["X-CSRFToken"] = csrfToken();
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
      cache: "no-store",
      signal,
    });
  } catch (error) {
    if (error?.name === "AbortError") throw error;
    throw new ApiError(0, null, errorMessage(0, null));
  }
  let parsed = null;
  const text = await response.text();
  if (text) {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = null;
    }
  }
  if (!response.ok) {
    throw new ApiError(response.status, parsed, errorMessage(response.status, parsed));
  }
  return parsed;
}
