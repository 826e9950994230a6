// The page's state, without any DOM or I/O: the conversation list and the open chat, each
// replaced by a snapshot and then moved on by events (docs/PROTOCOL.md §6). Events are absolute
// (they carry whole records), so applying one twice changes nothing.

/** "EPOCH:OFFSET" or {epoch, offset} -> {epoch, offset}. */
export function parseCursor(value) {
  if (value && typeof value === "object") return { epoch: value.epoch, offset: value.offset };
  const text = String(value);
  const at = text.lastIndexOf(":");
  return { epoch: text.slice(0, at), offset: Number(text.slice(at + 1)) };
}

export function cursorText(cursor) {
  return `${cursor.epoch}:${cursor.offset}`;
}

// --- the conversation list -----------------------------------------------------------------------

export class ConversationList {
  constructor() {
    /** id -> ConversationRecord */
    this.items = new Map();
  }

  replace(records) {
    this.items = new Map(records.map((r) => [r.id, r]));
  }

  /** Apply one agent event; true if the list changed. */
  apply(common) {
    const ev = common.event;
    switch (ev.type) {
      case "created":
        this.items.set(ev.conversation.id, ev.conversation);
        return true;
      case "deleted":
        return this.items.delete(ev.conversation_id);
      case "renamed":
      case "touched": {
        const old = this.items.get(ev.conversation_id);
        if (!old) return false;
        const updated = { ...old, updated_at: Math.max(old.updated_at, ev.updated_at) };
        if (ev.type === "renamed") updated.title = ev.title;
        if (common.cursor) updated.seq = Math.max(old.seq ?? 0, common.cursor.offset);
        this.items.set(old.id, updated);
        return true;
      }
      default:
        return false;
    }
  }

  /** Newest first (updated_at desc, then id for a stable order). */
  sorted() {
    return [...this.items.values()].sort(
      (a, b) => b.updated_at - a.updated_at || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0),
    );
  }
}

// --- one conversation ----------------------------------------------------------------------------

const TERMINAL = new Set(["assistant_message", "error"]);

export class Chat {
  constructor(id) {
    this.id = id;
    this.conversation = null;
    /** record id -> MessageRecord */
    this.records = new Map();
    /** turns interrupted before any answer: turn id -> offset of the `interrupted` event */
    this.interruptions = new Map();
    /** the answer being streamed: {turnId, text, reasoning, images, ended} or null */
    this.draft = null;
    /** the turn the live stream says is running ("?" when it is not known which) */
    this.runningTurn = null;
    /** the turn of the live stream's last `working` (null: not known since it was subscribed) */
    this.liveTurn = null;
    /** ids of the turns whose end is in the journal (an answer, an error or an interruption) */
    this.answered = new Set();
    this.deleted = false;
  }

  get running() {
    return this.runningTurn !== null;
  }

  /** Replace everything with a chat snapshot {cursor, conversation, messages}. */
  replace(snapshot) {
    this.conversation = snapshot.conversation;
    this.records = new Map(snapshot.messages.map((r) => [r.id, r]));
    this.interruptions = new Map();
    this.answered = new Set();
    for (const r of this.records.values()) {
      if (TERMINAL.has(r.message.type) && r.message.turn_id) this.answered.add(r.message.turn_id);
    }
    this.deleted = false;
    // A draft whose turn is unknown cannot be matched with the snapshot: drop it (a turn still
    // running starts a new one with its next chunk).
    const draft = this.draft;
    if (draft && (draft.ended || draft.turnId === null || this._answered(draft.turnId))) {
      this.draft = null;
    }
  }

  /** The live stream was (re)subscribed: a draft being streamed has missed chunks. */
  liveGap() {
    this.liveTurn = null;
    if (this.draft && !this.draft.ended) this.draft.partial = true;
  }

  /** Records and interruption notices in journal order. */
  items() {
    const out = [...this.records.values()].map((record) => ({ kind: "record", seq: record.seq, record }));
    for (const [turnId, seq] of this.interruptions) {
      if (!this._hasAnswer(turnId)) out.push({ kind: "interrupted", seq, turnId });
    }
    return out.sort((a, b) => a.seq - b.seq);
  }

  _hasAnswer(turnId) {
    for (const r of this.records.values()) {
      if (r.message.type === "assistant_message" && r.message.turn_id === turnId) return true;
    }
    return false;
  }

  _answered(turnId) {
    return turnId !== null && turnId !== undefined && this.answered.has(turnId);
  }

  /** The turn ended (durable proof): the draft and the running mark of that turn go. */
  _turnOver(turnId) {
    if (turnId !== null) this.answered.add(turnId);
    if (this.draft && (this.draft.turnId === turnId || this.draft.turnId === null)) this.draft = null;
    if (this.runningTurn === turnId || this.runningTurn === "?") this.runningTurn = null;
  }

  /** Apply one durable conversation event; true if anything shown changed. */
  applyDurable(common) {
    const ev = common.event;
    switch (ev.type) {
      case "user_message":
      case "tool_call":
      case "tool_result":
      case "tool_failed":
      case "approval_requested":
      case "approval_given":
      case "input_requested":
      case "input_given":
        this.records.set(ev.record.id, ev.record);
        return true;
      case "assistant_message":
      case "error":
        this.records.set(ev.record.id, ev.record);
        this._turnOver(ev.record.message.turn_id ?? null);
        return true;
      case "interrupted":
        if (ev.turn_id) this.interruptions.set(ev.turn_id, common.cursor?.offset ?? Infinity);
        this._turnOver(ev.turn_id ?? null);
        return true;
      case "branch_changed": {
        // What no longer is on the branch goes at once (the page then reads the branch again):
        // a regenerate's branch ends with its user message, an edit's before the edited one.
        const point = ev.record.message;
        const at = this.records.get(point.message_id);
        if (!at || point.kind === "switch") return false;
        const from = point.kind === "edit" ? at.seq : at.seq + 1;
        for (const [id, r] of this.records) {
          if (r.seq >= from && r.seq < ev.record.seq) this.records.delete(id);
        }
        return true;
      }
      case "renamed":
        if (this.conversation) this.conversation = { ...this.conversation, title: ev.title };
        return true;
      case "deleted":
        this.deleted = true;
        this.draft = null;
        this.runningTurn = null;
        return true;
      default:
        return false; // touched, conversation_closing, compaction_triggered: nothing to show
    }
  }

  /** Apply one online (live) event; true if anything shown changed. */
  applyLive(common) {
    const ev = common.event;
    switch (ev.type) {
      case "working":
        this.liveTurn = ev.turn_id ?? null;
        if (this._answered(this.liveTurn)) return false; // a late one: its turn is over
        this.runningTurn = ev.turn_id ?? "?";
        if (!this.draft || this.draft.turnId !== (ev.turn_id ?? null)) this._newDraft(ev.turn_id ?? null);
        return true;
      case "start_response":
      case "start_reasoning":
      case "append_text":
      case "append_reasoning":
      case "append_image":
        // The live and the durable stream are not ordered with each other: chunks of a turn
        // whose end is already in the journal come late, and the answer shows them already.
        if (this._answered(this.liveTurn)) return false;
        return this._appendLive(ev);
      case "end": {
        const turnId = ev.turn_id ?? null;
        if (this.runningTurn === turnId || this.runningTurn === "?") this.runningTurn = null;
        if (this.draft && (this.draft.turnId === turnId || this.draft.turnId === null)) {
          // The durable answer replaces the draft (it may be here already); an empty draft has
          // nothing to wait for.
          this.draft.ended = true;
          if (this._answered(turnId) || (!this.draft.text && !this.draft.images.length)) {
            this.draft = null;
          }
        }
        return true;
      }
      default:
        return false;
    }
  }

  _appendLive(ev) {
    switch (ev.type) {
      case "append_text":
        this._ensureDraft().text += ev.text;
        return true;
      case "append_reasoning":
        this._ensureDraft().reasoning += ev.text;
        return true;
      case "append_image":
        this._ensureDraft().images.push({ data: ev.data, mime: ev.mime });
        return true;
      default: // start_response, start_reasoning
        this._ensureDraft();
        return false;
    }
  }

  _newDraft(turnId) {
    this.draft = { turnId, text: "", reasoning: "", images: [], ended: false, partial: false };
    return this.draft;
  }

  _ensureDraft() {
    if (this.runningTurn === null) this.runningTurn = "?"; // joined in the middle of a turn
    return this.draft ?? this._newDraft(this.runningTurn === "?" ? null : this.runningTurn);
  }
}
