// Where the host project mounted the REST API and the pages. base.html writes the reversed
// URLs into <meta> tags, so a project that includes the apps under its own prefixes (say the
// pages under /agents/) gets working links; no module writes a route's path itself. The
// fallbacks are the dexagents project's own mounts (modules imported without a page).
// Websockets stay at /ws/: the host's ASGI router mounts agents_app.live.routing as it is.

function meta(name, fallback) {
  const node = globalThis.document?.querySelector(`meta[name="${name}"]`);
  return node?.getAttribute("content") || fallback;
}

const sessionsApi = meta("dexagents-sessions-api", "/api/v1/sessions/");
const approvalsApi = meta("dexagents-approvals-api", "/api/v1/approvals/");
const decisionsApi = meta("dexagents-decisions-api", "/api/v1/approvals/decisions/");
const sessionsPage = meta("dexagents-sessions-page", "/sessions/");

/** POST here to start a session; GET lists them. */
export const sessionsApiPath = sessionsApi;
/** Pending approvals (staff). */
export const approvalsApiPath = approvalsApi;
/** The approval decisions' audit trail (staff), paged with limit/offset. */
export const decisionsApiPath = decisionsApi;

/** A session's snapshot; its sub-resources ("queue/", "messages/", ...) are relative to it. */
export function sessionApiPath(sessionId) {
  return `${sessionsApi}${encodeURIComponent(sessionId)}/`;
}

/** The sessions list page. */
export const sessionsPagePath = sessionsPage;

/** The chat page of a session. */
export function sessionPagePath(sessionId) {
  return `${sessionsPage}${encodeURIComponent(sessionId)}/`;
}

/** The chat page of a session, scrolled to the tool call `toolCallId` (chat_approvals.mjs
 * reveals the element the `#call-<id>` fragment names once the conversation is rendered). */
export function sessionCallPath(sessionId, toolCallId) {
  return `${sessionPagePath(sessionId)}#call-${encodeURIComponent(toolCallId)}`;
}
