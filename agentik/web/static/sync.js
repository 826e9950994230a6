// The cursor protocol over one WebSocket (docs/PROTOCOL.md §5, §6).
//
// Two durable subscriptions, each with the cursor of the last event applied: `agent` (the
// conversation list) and `conversation` (the open chat), plus the open chat's `live` stream
// (streamed tokens; no cursor, never replayed). On every (re)connect:
//
//   - a stream with a cursor is resumed from it (`after`), so nothing is lost or repeated across
//     a network cut or a server restart;
//   - a stream without one, or whose cursor is dead (an `error` with code `gap`, the WebSocket
//     form of a 410), is resynced: subscribe from the head and buffer what arrives, read the
//     snapshot, replace the state with it, apply the buffered events newer than the snapshot's
//     cursor in offset order, then apply events as they come. A dead cursor is never retried.
//   - if the database epoch changed (the server runs on another database), every cursor is
//     dropped first.
//
// Before each connect a plain fetch of /agentik/cursor tells a 401 (ask for a token) from a
// server that is down (retry with backoff), which a refused WebSocket upgrade cannot show. The
// socket is dropped when nothing (not even the server's 15 s ping) arrived for WATCHDOG_MS.
// The backoff (retryDelay) stays short while someone looks at the page; the page tries at once
// when it is shown again or the network comes back (app.js calls retryNow).

import { AuthError, NetworkError } from "./api.js";
import { cursorText, parseCursor } from "./store.js";

const BACKOFF_MS = [250, 500, 1000, 2000];
/** the longest wait between two tries while the page is visible */
export const VISIBLE_MAX_MS = 3000;
/** ... and while it is hidden (nobody waits for it; it tries at once when shown) */
export const HIDDEN_MAX_MS = 30000;
const WATCHDOG_MS = 45000;
const LIST_LIMIT = 1000;

export class Connection {
  /**
   * handlers: status(state, detail) with state connecting | live | reconnecting | auth;
   * agentReset(snapshot), agentEvent(common), chatReset(id, snapshot), chatEvent(id, common),
   * chatLive(id, common), chatGone(id).
   */
  constructor(api, handlers) {
    this.api = api;
    this.h = handlers;
    this.epoch = null;
    this.agentCursor = null;
    this.chat = null; // {id, cursor}
    this.ws = null;
    this.subs = new Map(); // subscription id -> {kind, conversationId, buffer|null}
    this.pending = new Map(); // command id -> {resolve, reject}
    this.nextId = 0;
    this.attempt = 0;
    this.timer = null;
    this.watchdog = null;
    this.stopped = true;
    this.connecting = false;
    this.state = null;
    this.stats = { connects: 0, resumes: 0, resyncs: 0, gaps: 0, tries: 0 };
    /** the last scheduled waits before a try, in ms (newest last; for people and tests) */
    this.delays = [];
    this.ready = false;
    /** callers waiting for a conversation's live stream to be subscribed: [{id, done}] */
    this.liveWaiters = [];
  }

  // --- public ------------------------------------------------------------------------------------

  start() {
    this.stopped = false;
    this.retryNow();
  }

  /** Stop connecting (e.g. until a token is given). */
  pause(state = "auth", detail = "") {
    this.stopped = true;
    clearTimeout(this.timer);
    this._closeSocket();
    this._status(state, detail);
  }

  /** Connect now instead of waiting for the backoff. */
  retryNow() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.timer = null;
    if (this.ws || this.connecting) return;
    this._connect();
  }

  /** Follow another conversation (or none). */
  openChat(id) {
    if (this.chat?.id === id) return;
    for (const [subId, sub] of this.subs) {
      if (sub.kind === "conversation" || sub.kind === "live") this._unsubscribe(subId);
    }
    this.chat = id ? { id, cursor: null, followed: false } : null;
    if (id && this.ready) this._followChat().catch((exc) => this._failed(exc));
  }

  /**
   * Resolves once the live stream of conversation `id` is subscribed, at once when the socket
   * is not open (or closes meanwhile), and after `ms` at the latest. The server sends streamed
   * tokens only to subscribers present when they are produced, so a first message sent into a
   * conversation opened a moment ago would otherwise stream its first tokens to nobody while
   * the page's subscribe is still on its way.
   */
  whenLive(id, ms) {
    if (!this._isOpen()) return Promise.resolve();
    for (const sub of this.subs.values()) {
      if (sub.kind === "live" && sub.conversationId === id && sub.acked) return Promise.resolve();
    }
    return new Promise((resolve) => {
      const waiter = { id, done: null };
      const timer = setTimeout(() => waiter.done(), ms);
      waiter.done = () => {
        clearTimeout(timer);
        this.liveWaiters = this.liveWaiters.filter((w) => w !== waiter);
        resolve();
      };
      this.liveWaiters.push(waiter);
    });
  }

  // --- connecting --------------------------------------------------------------------------------

  _status(state, detail = "") {
    this.state = state;
    this.h.status(state, detail);
  }

  _isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  async _connect() {
    if (this.connecting) return;
    this.connecting = true;
    try {
      await this._tryConnect();
    } finally {
      this.connecting = false;
    }
  }

  async _tryConnect() {
    this.ready = false;
    this.stats.tries++;
    this._status(this.attempt === 0 && this.stats.connects === 0 ? "connecting" : "reconnecting");
    let head;
    try {
      head = parseCursor((await this.api.cursor()).current);
    } catch (exc) {
      if (exc instanceof AuthError) {
        this.pause("auth", exc.message);
        return;
      }
      this._scheduleRetry(exc instanceof NetworkError ? "server unreachable" : exc.message);
      return;
    }
    if (this.stopped) return;
    if (this.epoch !== null && head.epoch !== this.epoch) {
      // Another database: no cursor of the old one means anything here.
      this.agentCursor = null;
      if (this.chat) this.chat.cursor = null;
    }
    this.epoch = head.epoch;
    const ws = new WebSocket(this.api.wsUrl());
    this.ws = ws;
    ws.onopen = () => this._opened(ws);
    ws.onmessage = (msg) => this._frame(ws, msg);
    ws.onclose = () => this._closed(ws);
    ws.onerror = () => {}; // always followed by close
  }

  async _opened(ws) {
    if (ws !== this.ws) return;
    this.stats.connects++;
    this._kick();
    try {
      await this._followAgent();
      while (ws === this.ws && this.chat && !this.chat.followed) await this._followChat();
    } catch (exc) {
      this._failed(exc);
      return;
    }
    if (ws !== this.ws) return;
    this.attempt = 0;
    this.ready = true;
    this._status("live", "");
  }

  _closed(ws) {
    if (ws !== this.ws) return;
    this.ws = null;
    this.ready = false;
    clearTimeout(this.watchdog);
    this.subs.clear();
    if (this.chat) this.chat.followed = false;
    for (const w of [...this.liveWaiters]) w.done();
    for (const { reject } of this.pending.values()) reject(new NetworkError("connection closed"));
    this.pending.clear();
    if (!this.stopped) this._scheduleRetry("connection lost");
  }

  _closeSocket() {
    const ws = this.ws;
    if (ws) {
      this._closed(ws);
      ws.close();
    }
  }

  _scheduleRetry(why) {
    if (this.stopped) return;
    const delay = retryDelay(this.attempt, document.visibilityState === "hidden", Math.random());
    this.attempt++;
    this.delays = [...this.delays.slice(-19), delay];
    const due = Date.now() + delay;
    clearTimeout(this.timer);
    const tick = () => {
      const left = due - Date.now();
      if (left <= 0) {
        this.timer = null;
        this._connect();
        return;
      }
      this._status("reconnecting", `Reconnecting in ${Math.ceil(left / 1000)} s (${why})`);
      this.timer = setTimeout(tick, Math.min(left, 250));
    };
    tick();
  }

  /** Something unexpected: drop the socket and start over (with backoff). */
  _failed(exc) {
    if (exc instanceof AuthError) {
      this.pause("auth", exc.message);
      return;
    }
    if (!(exc instanceof NetworkError)) console.warn("agentik: resync failed:", exc);
    this._closeSocket();
  }

  _kick() {
    clearTimeout(this.watchdog);
    const ws = this.ws;
    this.watchdog = setTimeout(() => {
      if (ws === this.ws) ws.close(); // silent for too long: a dead connection
    }, WATCHDOG_MS);
  }

  // --- frames ------------------------------------------------------------------------------------

  _send(frame) {
    this.ws.send(JSON.stringify(frame));
  }

  _command(type, fields) {
    if (!this._isOpen()) return Promise.reject(new NetworkError("not connected"));
    // A subscribe's id names the subscription; other commands get a fresh one.
    const id = fields.id ?? `c${++this.nextId}`;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this._send({ type, ...fields, id });
    });
  }

  _frame(ws, msg) {
    if (ws !== this.ws) return;
    this._kick();
    let frame;
    try {
      frame = JSON.parse(msg.data);
    } catch {
      console.warn("agentik: a frame that is not JSON");
      return;
    }
    switch (frame.type) {
      case "reply":
      case "error": {
        const waiter = frame.id != null ? this.pending.get(frame.id) : undefined;
        if (waiter) {
          this.pending.delete(frame.id);
          if (frame.type === "reply") waiter.resolve(frame.result);
          else waiter.reject(new StreamError(frame.error));
        } else if (frame.subscription) {
          this._subscriptionFailed(frame.subscription, frame.error);
        } else if (frame.type === "error") {
          console.warn("agentik: server error frame", frame.error);
        }
        return;
      }
      case "events":
        for (const ev of frame.events) this._event(frame.subscription, ev);
        return;
      case "ended":
        this._ended(frame.subscription, frame.reason);
        return;
      case "ping":
        this._send({ type: "pong" });
        return;
      default:
        return; // pong, or a frame type this page does not know
    }
  }

  _newSub(kind, conversationId, buffering) {
    const id = `${kind}-${++this.nextId}`;
    this.subs.set(id, { kind, conversationId, buffer: buffering ? [] : null });
    return id;
  }

  _unsubscribe(subId) {
    this.subs.delete(subId); // its frames are ignored from now on
    if (this._isOpen()) this._command("unsubscribe", { subscription: subId }).catch(() => {});
  }

  _event(subId, common) {
    const sub = this.subs.get(subId);
    if (!sub) return;
    if (sub.buffer) {
      sub.buffer.push(common);
      return;
    }
    this._apply(sub, common);
  }

  _apply(sub, common) {
    if (sub.kind === "live") {
      if (this.chat?.id === sub.conversationId) this.h.chatLive(sub.conversationId, common);
      return;
    }
    const offset = common.cursor.offset;
    if (sub.kind === "agent") {
      if (this.agentCursor && offset <= parseCursor(this.agentCursor).offset) return;
      this.agentCursor = cursorText(common.cursor);
      this.h.agentEvent(common);
      return;
    }
    const chat = this.chat;
    if (!chat || chat.id !== sub.conversationId) return;
    if (chat.cursor && offset <= parseCursor(chat.cursor).offset) return;
    chat.cursor = cursorText(common.cursor);
    this.h.chatEvent(chat.id, common);
  }

  _subscriptionFailed(subId, error) {
    const sub = this.subs.get(subId);
    if (!sub) return;
    this.subs.delete(subId);
    if (error?.code === "gap") {
      this.stats.gaps++;
      const work = sub.kind === "agent" ? this._resyncAgent() : this._resyncChat(sub.conversationId);
      work.catch((exc) => this._failed(exc));
    } else {
      // The runtime is closing, or something else went wrong: start over.
      this._closeSocket();
    }
  }

  _ended(subId, reason) {
    const sub = this.subs.get(subId);
    if (!sub) return;
    this.subs.delete(subId);
    if (sub.kind === "conversation" && reason === "deleted") {
      this.h.chatGone(sub.conversationId);
    } else if (sub.kind === "live" && this.chat?.id === sub.conversationId) {
      this._followLive(sub.conversationId).catch((exc) => this._failed(exc)); // fell behind
    }
  }

  // --- following streams -------------------------------------------------------------------------

  async _followAgent() {
    if (this.agentCursor) {
      const subId = this._newSub("agent", null, false);
      try {
        await this._command("subscribe", { id: subId, stream: "agent", after: this.agentCursor });
        this.stats.resumes++;
        return;
      } catch (exc) {
        this.subs.delete(subId);
        if (!(exc instanceof StreamError && exc.code === "gap")) throw exc;
        this.stats.gaps++;
      }
    }
    await this._resyncAgent();
  }

  async _resyncAgent() {
    this.stats.resyncs++;
    const subId = this._newSub("agent", null, true);
    await this._subscribe(subId, { stream: "agent" });
    const snapshot = await this._command("list", { limit: LIST_LIMIT });
    const sub = this.subs.get(subId);
    if (!sub) return; // the socket went away meanwhile; the next connect starts again
    this.agentCursor = cursorText(snapshot.cursor);
    this.h.agentReset(snapshot);
    this._drain(sub);
  }

  async _followChat() {
    const chat = this.chat;
    if (!chat || chat.followed) return;
    chat.followed = true;
    await this._followLive(chat.id);
    if (this.chat !== chat) return;
    if (chat.cursor) {
      const subId = this._newSub("conversation", chat.id, false);
      try {
        await this._command("subscribe", {
          id: subId, stream: "conversation", conversation_id: chat.id, after: chat.cursor,
        });
        this.stats.resumes++;
        this._dropIfStale(subId, chat.id);
        return;
      } catch (exc) {
        this.subs.delete(subId);
        if (this._gone(exc, chat.id)) return;
        if (!(exc instanceof StreamError && exc.code === "gap")) throw exc;
        this.stats.gaps++;
      }
    }
    await this._resyncChat(chat.id);
  }

  async _followLive(id) {
    const subId = this._newSub("live", id, false);
    try {
      await this._subscribe(subId, { stream: "live", conversation_id: id });
    } catch (exc) {
      this.subs.delete(subId);
      if (!this._gone(exc, id)) throw exc;
      return;
    }
    const sub = this.subs.get(subId);
    if (sub) sub.acked = true;
    for (const w of this.liveWaiters.filter((w) => w.id === id)) w.done();
    // Live events sent while this page was not subscribed are gone for good.
    if (this.chat?.id === id) this.h.chatLiveGap(id);
    this._dropIfStale(subId, id);
  }

  /** Another conversation was opened while subscribing to `id`: let the subscription go. */
  _dropIfStale(subId, id) {
    if (this.chat?.id !== id && this.subs.has(subId)) this._unsubscribe(subId);
  }

  async _resyncChat(id) {
    if (this.chat?.id !== id) return;
    this.stats.resyncs++;
    const subId = this._newSub("conversation", id, true);
    let snapshot;
    try {
      await this._subscribe(subId, { stream: "conversation", conversation_id: id });
      snapshot = await this._command("snapshot", { conversation_id: id });
    } catch (exc) {
      this.subs.delete(subId);
      if (this._gone(exc, id)) return;
      throw exc;
    }
    const sub = this.subs.get(subId);
    if (!sub) return;
    if (this.chat?.id !== id) {
      this._unsubscribe(subId);
      return;
    }
    this.chat.cursor = cursorText(snapshot.cursor);
    this.h.chatReset(id, snapshot);
    this._drain(sub);
  }

  async _subscribe(subId, fields) {
    try {
      await this._command("subscribe", { id: subId, ...fields });
    } catch (exc) {
      this.subs.delete(subId);
      throw exc;
    }
  }

  /** Apply what was buffered during a resync (the too-old part is skipped by the cursor). */
  _drain(sub) {
    const buffered = sub.buffer ?? [];
    sub.buffer = null;
    buffered.sort((a, b) => a.cursor.offset - b.cursor.offset);
    for (const ev of buffered) this._apply(sub, ev);
  }

  _gone(exc, id) {
    if (exc instanceof StreamError && exc.code === "not_found") {
      this.h.chatGone(id);
      return true;
    }
    return false;
  }
}

/** The wait before the next try after `attempt` failed ones, in ms: growing, at most
 * VISIBLE_MAX_MS while the page is visible (HIDDEN_MAX_MS while hidden), and up to 20 % shorter
 * at random (`random` in [0, 1)) so that the pages of a restarted server do not all come back
 * at once. */
export function retryDelay(attempt, hidden, random) {
  const base = BACKOFF_MS[attempt] ?? VISIBLE_MAX_MS * 2 ** (attempt - BACKOFF_MS.length);
  const most = Math.min(base, hidden ? HIDDEN_MAX_MS : VISIBLE_MAX_MS);
  return Math.round(most * (1 - 0.2 * random));
}

/** An `error` frame answering a command or ending a subscription. */
export class StreamError extends Error {
  constructor(error) {
    super(error?.message ?? "error");
    this.name = "StreamError";
    this.code = error?.code ?? "error";
    this.detail = error ?? {};
  }
}
