// A websocket client that resumes: it reconnects with backoff and asks the relay for the
// messages after the last token it delivered, so a page neither loses nor repeats an event.
//
// Protocol (the session events relay, /ws/sessions/<id>/events/[?after=<token>]):
//   {"type": "event", "token": "<resume token>", "event": {...}}   one per Stream message
//   {"type": "snapshot_required"}   `after` is no longer retained: reload the snapshot
// Any other JSON frame (e.g. {"type": "approvals_changed"}) goes to `onFrame` as is.
// Close codes 4401 / 4403 / 4404 are refusals (not authenticated / not allowed / unknown
// or unreadable session): the client stops and reports them. 4408 (too slow) and network losses reconnect.
//
// No DOM use: the constructor takes the WebSocket class and the timer functions, so the
// module runs under `node --test` with fakes.

/** Close codes after which reconnecting cannot help. */
export const REFUSAL_CLOSE_CODES = Object.freeze(new Set([4401, 4403, 4404]));

/** How many delivered tokens are remembered to drop a repeated frame. */
export const REMEMBERED_TOKENS = 10000;

/**
 * The delay before reconnect attempt `attempt` (0-based): exponential from `minDelay`,
 * capped at `maxDelay`, scaled by a jitter factor in [0.5, 1) so many pages that lost the
 * same server do not come back at the same instant.
 */
export function backoffDelay(attempt, { minDelay = 500, maxDelay = 10000, random = Math.random } = {}) {
  const exponential = Math.min(maxDelay, minDelay * 2 ** Math.min(attempt, 16));
  return Math.round(exponential * (0.5 + random() / 2));
}

/** Append `?after=<token>` (or `&after=`) to `url` when `token` is not empty. */
export function urlWithAfter(url, token) {
  if (!token) return url;
  const separator = url.includes("?") ? "&" : "?";
  return `${url}${separator}after=${encodeURIComponent(token)}`;
}

/**
 * Turn a same-origin path into a ws:// or wss:// URL for `location` (the page's).
 */
export function websocketUrl(path, location = globalThis.location) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${path}`;
}

/** Remembers the last `limit` tokens in insertion order. */
class TokenMemory {
  constructor(limit) {
    this.limit = limit;
    this.tokens = new Set();
  }

  has(token) {
    return this.tokens.has(token);
  }

  add(token) {
    this.tokens.add(token);
    if (this.tokens.size > this.limit) {
      const oldest = this.tokens.values().next().value;
      this.tokens.delete(oldest);
    }
  }
}

/**
 * A resuming websocket.
 *
 * Options:
 *   url: the websocket URL without `after`.
 *   after: the token to start after ("" = the relay's oldest retained message).
 *   onEvent(frame): an `event` frame, at most once per token for the life of the client.
 *   onSnapshotRequired(): the relay no longer holds `after`; it continues from its oldest
 *       retained message, and the page should reload its snapshot.
 *   onFrame(frame): any other frame.
 *   onOpen({reconnected}): the socket opened; `reconnected` is false only the first time.
 *   onStateChange(state, detail): "connecting" ({reconnect}) | "open" | "waiting" ({code,
 *       delay}: the backoff before the next attempt) | "offline" (paused until
 *       reconnectNow) | "refused" ({code}) | "stopped".
 *   WebSocketImpl, setTimer, clearTimer, random: injectable for tests.
 */
export class ResumableSocket {
  constructor({
    url,
    after = "",
    onEvent = () => {},
    onSnapshotRequired = () => {},
    onFrame = () => {},
    onOpen = () => {},
    onStateChange = () => {},
    WebSocketImpl = globalThis.WebSocket,
    setTimer = (callback, delay) => setTimeout(callback, delay),
    clearTimer = (handle) => clearTimeout(handle),
    random = Math.random,
    minDelay = 500,
    maxDelay = 10000,
  }) {
    this.url = url;
    this.token = after || "";
    this.handlers = { onEvent, onSnapshotRequired, onFrame, onOpen, onStateChange };
    this.WebSocketImpl = WebSocketImpl;
    this.setTimer = setTimer;
    this.clearTimer = clearTimer;
    this.backoff = { minDelay, maxDelay, random };
    this.delivered = new TokenMemory(REMEMBERED_TOKENS);
    this.socket = null;
    this.timer = null;
    this.attempt = 0;
    this.opened = false;
    this.state = "idle";
  }

  /** The token of the last delivered event ("" before the first). */
  get lastToken() {
    return this.token;
  }

  /** Connect (once); later connections happen by themselves. */
  start() {
    if (this.state !== "idle") return;
    this.connect();
  }

  /**
   * Reconnect at once instead of waiting for the backoff (the network came back, the page
   * regained focus). Does nothing while a socket is open or being opened.
   */
  reconnectNow() {
    if (this.state !== "waiting" && this.state !== "offline") return;
    this.clearTimer(this.timer);
    this.timer = null;
    this.connect();
  }

  /**
   * Drop the current socket and connect again after `token` (e.g. a snapshot's
   * `events_after` once a `snapshot_required` was handled). Delivered tokens are still
   * remembered, so frames the page already had are not repeated.
   */
  resumeFrom(token) {
    if (this.state === "stopped" || this.state === "refused") return;
    this.token = token || "";
    this.clearTimer(this.timer);
    this.timer = null;
    this.detach();
    this.connect();
  }

  /**
   * The device lost its network (the page's `offline` event): drop the socket, which can no
   * longer be trusted to deliver, and wait for `reconnectNow` instead of retrying blindly.
   */
  pause() {
    if (this.state === "stopped" || this.state === "refused" || this.state === "idle") return;
    this.clearTimer(this.timer);
    this.timer = null;
    this.detach();
    this.setState("offline");
  }

  /** Close for good (page unload). */
  stop() {
    this.clearTimer(this.timer);
    this.timer = null;
    this.detach();
    this.setState("stopped");
  }

  setState(state, detail = {}) {
    this.state = state;
    this.handlers.onStateChange(state, detail);
  }

  detach() {
    const socket = this.socket;
    this.socket = null;
    if (socket) {
      socket.onopen = socket.onmessage = socket.onclose = socket.onerror = null;
      try {
        socket.close(1000);
      } catch {
        // Closing a socket that never opened may throw in some engines; it is gone anyway.
      }
    }
  }

  connect() {
    this.setState("connecting", { reconnect: this.opened });
    let socket;
    try {
      socket = new this.WebSocketImpl(urlWithAfter(this.url, this.token));
    } catch {
      this.scheduleReconnect(1006);
      return;
    }
    this.socket = socket;
    socket.onopen = () => {
      if (socket !== this.socket) return;
      const reconnected = this.opened;
      this.opened = true;
      this.attempt = 0;
      this.setState("open");
      this.handlers.onOpen({ reconnected });
    };
    socket.onmessage = (message) => {
      if (socket !== this.socket) return;
      this.receive(message.data);
    };
    socket.onclose = (close) => {
      if (socket !== this.socket) return;
      this.socket = null;
      if (REFUSAL_CLOSE_CODES.has(close.code)) {
        this.setState("refused", { code: close.code });
        return;
      }
      this.scheduleReconnect(close.code);
    };
    // Errors are always followed by a close, which decides what happens next.
    socket.onerror = () => {};
  }

  receive(data) {
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      return;
    }
    if (!frame || typeof frame !== "object") return;
    if (frame.type === "event") {
      const token = typeof frame.token === "string" ? frame.token : "";
      if (token) {
        if (this.delivered.has(token)) return;
        this.delivered.add(token);
        this.token = token;
      }
      this.handlers.onEvent(frame);
    } else if (frame.type === "snapshot_required") {
      this.handlers.onSnapshotRequired();
    } else {
      this.handlers.onFrame(frame);
    }
  }

  scheduleReconnect(code) {
    const delay = backoffDelay(this.attempt, this.backoff);
    this.attempt += 1;
    this.setState("waiting", { code, delay });
    this.timer = this.setTimer(() => {
      this.timer = null;
      this.connect();
    }, delay);
  }
}
