// HTTP access to the agentik API (docs/PROTOCOL.md): JSON bodies, JSON errors, the bearer token
// from localStorage, X-Client-Id. A 401 calls `onUnauthorized` (the page asks for a token) and
// rejects with AuthError.

const TOKEN_KEY = "agentik.token";
const CLIENT_KEY = "agentik.clientId";

export class ApiError extends Error {
  constructor(status, code, message, detail) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.detail = detail ?? {};
  }
}

/** The server said 401: no token, or a token it does not know. */
export class AuthError extends ApiError {
  constructor(message) {
    super(401, "unauthorized", message);
    this.name = "AuthError";
  }
}

/** The server could not be reached (network down, server restarting). */
export class NetworkError extends Error {
  constructor(message) {
    super(message);
    this.name = "NetworkError";
  }
}

/** A random id; works outside secure contexts too (no crypto.randomUUID there). */
export function randomId() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function storage() {
  try {
    return window.localStorage;
  } catch {
    return null; // storage disabled: the token lives for this page only
  }
}

export class Api {
  constructor(base = "/agentik") {
    this.base = base;
    this.onUnauthorized = () => {};
    const store = storage();
    this._token = store?.getItem(TOKEN_KEY) || null;
    let clientId = store?.getItem(CLIENT_KEY);
    if (!clientId) {
      clientId = `agentik-web-${randomId().slice(0, 12)}`;
      store?.setItem(CLIENT_KEY, clientId);
    }
    this.clientId = clientId;
  }

  get token() {
    return this._token;
  }

  setToken(token) {
    this._token = token || null;
    const store = storage();
    if (this._token) store?.setItem(TOKEN_KEY, this._token);
    else store?.removeItem(TOKEN_KEY);
  }

  /** The token changed in another tab: pick it up. */
  reloadToken() {
    this._token = storage()?.getItem(TOKEN_KEY) || null;
  }

  async request(method, path, body, headers = {}) {
    const init = {
      method,
      cache: "no-store",
      headers: { Accept: "application/json", "X-Client-Id": this.clientId, ...headers },
    };
    if (this._token) init.headers.Authorization = `Bearer ${this._token}`;
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(this.base + path, init);
    } catch (exc) {
      throw new NetworkError(`cannot reach the server (${exc.message})`);
    }
    let data = null;
    if (response.status !== 204) {
      const text = await response.text().catch(() => "");
      try {
        data = text ? JSON.parse(text) : null;
      } catch {
        data = null;
      }
    }
    if (response.status === 401) {
      const message = data?.error?.message ?? "authentication required";
      this.onUnauthorized(message);
      throw new AuthError(message);
    }
    if (!response.ok) {
      const error = data?.error ?? {};
      throw new ApiError(
        response.status,
        error.code ?? "http_error",
        error.message ?? `${response.status} ${response.statusText}`,
        error,
      );
    }
    return data;
  }

  get(path) {
    return this.request("GET", path);
  }

  /** The WebSocket URL, with the token as ?access_token= (browsers cannot set headers there). */
  wsUrl() {
    const url = new URL(`${this.base}/ws`, window.location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    if (this._token) url.searchParams.set("access_token", this._token);
    return url.href;
  }

  cursor() {
    return this.get("/cursor");
  }

  /** A new conversation; ``agent`` (null: the default one) says whose. */
  createConversation(title, agent) {
    const body = title ? { title } : {};
    if (agent) body.agent = agent;
    return this.request("POST", "/conversations", body, { "Idempotency-Key": randomId() });
  }

  agents() {
    return this.get("/agents");
  }

  renameConversation(id, title) {
    return this.request("PATCH", `/conversations/${encodeURIComponent(id)}`, { title });
  }

  deleteConversation(id) {
    return this.request("DELETE", `/conversations/${encodeURIComponent(id)}`);
  }

  send(id, text) {
    return this.request(
      "POST",
      `/conversations/${encodeURIComponent(id)}/messages`,
      {
        content: [{ type: "text", body: text }],
        context: { origin: { kind: "user", id: this.clientId } },
      },
      { "Idempotency-Key": randomId() },
    );
  }

  interrupt(id) {
    return this.request("POST", `/conversations/${encodeURIComponent(id)}/interrupt`);
  }

  // branches (docs/PROTOCOL.md "Branches")

  _message(id, messageId) {
    return `/conversations/${encodeURIComponent(id)}/messages/${encodeURIComponent(messageId)}`;
  }

  snapshot(id) {
    return this.get(`/conversations/${encodeURIComponent(id)}/snapshot`);
  }

  edit(id, messageId, text) {
    return this.request("POST", `${this._message(id, messageId)}/edit`,
      { content: [{ type: "text", body: text }], context: { origin: { kind: "user", id: this.clientId } } },
      { "Idempotency-Key": randomId() });
  }

  regenerate(id, messageId) {
    return this.request("POST", `${this._message(id, messageId)}/regenerate`, {},
      { "Idempotency-Key": randomId() });
  }

  siblings(id, messageId) {
    return this.get(`${this._message(id, messageId)}/siblings`);
  }

  /** Make a version current; answers the conversation's snapshot after the switch. */
  branch(id, messageId) {
    return this.request("POST", `/conversations/${encodeURIComponent(id)}/branch`,
      { message_id: messageId }, { "Idempotency-Key": randomId() });
  }

  /** Answer the approval the paused call `callId` waits for. */
  approve(id, callId, approve, reason) {
    return this.request(
      "POST",
      `/conversations/${encodeURIComponent(id)}/approvals/${encodeURIComponent(callId)}`,
      { approve, reason },
    );
  }

  /** Answer the question of the paused call `callId`: `{text}` or `{data}`. */
  answer(id, callId, body) {
    return this.request(
      "POST",
      `/conversations/${encodeURIComponent(id)}/inputs/${encodeURIComponent(callId)}`,
      body,
    );
  }
}
