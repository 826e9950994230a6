// The built-in web chat: wires the state (store.js) and the connection (sync.js) to the DOM.
// Model output is untrusted: it only ever reaches the page as text nodes or through
// renderMarkdown, which builds DOM nodes (never innerHTML).

import { agentName, chosenAgent, loadAgents } from "./agents.js";
import { Api, ApiError, AuthError, NetworkError } from "./api.js";
import { answerControls, editor, userControls } from "./branches.js";
import { renderMarkdown } from "./markdown.js";
import { pauseNode, pauseSig } from "./pauses.js";
import { Chat, ConversationList } from "./store.js";
import { Connection } from "./sync.js";

const $ = (id) => document.getElementById(id);
const IMAGE_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
/** the characters of a message's text shown before a "show all" button */
const SHOWN_CHARS = 100_000;
/** how long a first message waits for its new conversation's live stream (see Connection.whenLive) */
const LIVE_WAIT_MS = 5000;
const STATUS_TEXT = {
  connecting: "Connecting…",
  live: "Live",
  reconnecting: "Reconnecting…",
  auth: "Token needed",
};

const api = new Api();
const list = new ConversationList();
/** @type {Chat | null} */
let chat = null;
/** key -> {node, sig} of the open chat's message elements */
let nodes = new Map();
let draftFrame = 0;
/** the id of the user message being edited (branches.js's editor replaces its text) */
let editing = null;
let hadToken = Boolean(api.token);

const connection = new Connection(api, {
  status: showStatus,
  agentReset(snapshot) {
    list.replace(snapshot.conversations);
    renderList();
    loadAgents(api).then(renderList);
  },
  agentEvent(common) {
    if (list.apply(common)) renderList();
    if (common.event.type === "deleted" && chat?.id === common.event.conversation_id) {
      chatGone(chat.id);
    }
    if (common.event.type === "renamed" && chat?.id === common.event.conversation_id) renderHead();
  },
  chatReset(id, snapshot) {
    if (chat?.id !== id) return;
    chat.replace(snapshot);
    renderChat();
  },
  chatEvent(id, common) {
    if (chat?.id === id) followBranches(chat, common);
    if (chat?.id !== id || !chat.applyDurable(common)) return;
    if (common.event.type === "deleted") chatGone(id);
    else renderChat();
  },
  chatLiveGap(id) {
    if (chat?.id !== id || !chat.draft) return;
    chat.liveGap();
    scheduleDraft();
  },
  chatLive(id, common) {
    if (chat?.id !== id || !chat.applyLive(common)) return;
    scheduleDraft();
  },
  chatGone,
});

api.onUnauthorized = (message) => {
  connection.pause("auth", message);
  askToken(message);
};

// --- connection state and the token -------------------------------------------------------------

function showStatus(state, detail) {
  if (state === "live") clearTransientNotice();
  const el = $("connection-status");
  el.dataset.state = state;
  el.textContent = state === "reconnecting" && detail ? detail : STATUS_TEXT[state];
  $("reconnect-now").hidden = state !== "reconnecting";
  if (state === "auth") askToken(detail);
}

function askToken(message) {
  const dialog = $("token-dialog");
  $("token-message").textContent = hadToken
    ? `The server refused the token (${message || "unauthorized"}). Enter another one.`
    : "This server needs an access token.";
  if (!dialog.open) {
    dialog.showModal();
    $("token-input").value = "";
  }
  $("token-input").focus();
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token-input").value.trim();
  if (!token) return;
  api.setToken(token);
  hadToken = true;
  $("token-dialog").close();
  $("change-token").hidden = false;
  connection.start();
});

$("token-dialog").addEventListener("cancel", (event) => {
  if (connection.state === "auth") event.preventDefault(); // nothing works without a token
});

$("change-token").addEventListener("click", () => {
  hadToken = false;
  connection.pause("auth", "");
});

$("reconnect-now").addEventListener("click", () => connection.retryNow());
// The network is back, or someone looks at the page again: try now, not when the backoff says.
window.addEventListener("online", () => connection.retryNow());
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") connection.retryNow();
});
window.addEventListener("storage", (event) => {
  if (event.key === "agentik.token") {
    api.reloadToken();
    if (connection.state === "auth" && api.token) {
      $("token-dialog").close();
      connection.start();
    }
  }
});

// --- notices -------------------------------------------------------------------------------------

/** Whether the notice shown is about a passing condition (no network, a busy server): such a
 * notice goes when the page is live again or the next request succeeds. */
let noticeTransient = false;

function notify(text, transient = false) {
  $("notice-text").textContent = text;
  $("notice").hidden = false;
  noticeTransient = transient;
}

function clearTransientNotice() {
  if (noticeTransient) $("notice").hidden = true;
  noticeTransient = false;
}

function failed(what, exc) {
  if (exc instanceof AuthError) return; // the token dialog is up
  if (exc instanceof NetworkError) notify(`${what}: the server cannot be reached. Try again.`, true);
  else if (exc instanceof ApiError) notify(`${what}: ${exc.message}`, exc.status === 429 || exc.status === 503);
  else {
    notify(`${what}: ${exc}`);
    console.error(exc);
  }
}

$("notice-close").addEventListener("click", () => {
  $("notice").hidden = true;
  noticeTransient = false;
});

// --- the conversation list -----------------------------------------------------------------------

function titleOf(record) {
  return record?.title || "Untitled conversation";
}

function timeText(seconds) {
  const date = new Date(seconds * 1000);
  const now = new Date();
  return date.toDateString() === now.toDateString()
    ? date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : date.toLocaleDateString([], { month: "short", day: "numeric" });
}

function renderList() {
  const ul = $("conversation-list");
  const focused = document.activeElement?.closest?.(".conv-item")?.dataset.id;
  const items = list.sorted();
  const rows = items.map((record) => {
    const li = document.createElement("li");
    li.className = "conv-item";
    li.dataset.testid = "conversation-item";
    li.dataset.id = record.id;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "conv-open";
    if (chat?.id === record.id) button.setAttribute("aria-current", "page");
    const title = document.createElement("span");
    title.className = "conv-title";
    title.textContent = titleOf(record);
    const time = document.createElement("time");
    time.className = "conv-time";
    time.dateTime = new Date(record.updated_at * 1000).toISOString();
    time.textContent = timeText(record.updated_at);
    button.append(title, time);
    const agent = agentName(record.agent);
    if (agent) {
      const tag = document.createElement("span");
      tag.className = "conv-agent";
      tag.dataset.testid = "conversation-agent";
      tag.textContent = agent;
      button.append(tag);
    }
    button.addEventListener("click", () => {
      go(record.id);
      closeSidebar();
    });
    li.append(button);
    return li;
  });
  ul.replaceChildren(...rows);
  $("conversation-empty").hidden = items.length > 0;
  if (focused) ul.querySelector(`.conv-item[data-id="${CSS.escape(focused)}"] button`)?.focus();
  if (chat) renderHead();
}

$("new-conversation").addEventListener("click", async () => {
  try {
    const record = await api.createConversation(undefined, chosenAgent());
    list.items.set(record.id, list.items.get(record.id) ?? record);
    renderList();
    go(record.id);
    closeSidebar();
    $("message-input").focus();
  } catch (exc) {
    failed("Could not create a conversation", exc);
  }
});

// --- opening a conversation ----------------------------------------------------------------------

function routeId() {
  const m = /^#\/c\/([^/?#]+)$/.exec(window.location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}

function go(id) {
  const hash = id ? `#/c/${encodeURIComponent(id)}` : "";
  if (window.location.hash !== hash) {
    if (hash) window.location.hash = hash;
    else history.pushState(null, "", window.location.pathname + window.location.search);
  }
  openChat(id);
}

function openChat(id) {
  if ((chat?.id ?? null) === id) return;
  chat = id ? new Chat(id) : null;
  nodes = new Map();
  $("messages").replaceChildren();
  cancelRename();
  connection.openChat(id);
  renderChat();
  renderList();
}

window.addEventListener("hashchange", () => openChat(routeId()));

function chatGone(id) {
  if (chat?.id !== id) return;
  chat.deleted = true;
  chat.draft = null;
  chat.runningTurn = null;
  list.items.delete(id);
  renderList();
  renderChat();
}

function renderHead() {
  const record = chat ? (list.items.get(chat.id) ?? chat.conversation) : null;
  const title = chat ? (chat.deleted ? "Deleted conversation" : titleOf(record)) : "agentik";
  $("chat-title").textContent = title;
  document.title = chat ? `${title} · agentik` : "agentik";
  $("chat-actions").hidden = !chat || chat.deleted;
}

// --- rename and delete ---------------------------------------------------------------------------

$("rename-conversation").addEventListener("click", () => {
  if (!chat) return;
  $("rename-input").value = list.items.get(chat.id)?.title ?? chat.conversation?.title ?? "";
  $("rename-form").hidden = false;
  $("chat-title").hidden = true;
  $("rename-input").focus();
  $("rename-input").select();
});

function cancelRename() {
  $("rename-form").hidden = true;
  $("chat-title").hidden = false;
}

$("rename-cancel").addEventListener("click", cancelRename);
$("rename-input").addEventListener("keydown", (event) => {
  if (event.key === "Escape") cancelRename();
});

$("rename-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  if (!chat) return;
  const id = chat.id;
  const title = $("rename-input").value.trim() || null;
  cancelRename();
  try {
    const record = await api.renameConversation(id, title);
    if (list.items.has(id)) list.items.set(id, { ...list.items.get(id), title: record.title });
    renderList();
  } catch (exc) {
    failed("Could not rename", exc);
  }
});

let deleteArmed = null;
$("delete-conversation").addEventListener("click", async () => {
  if (!chat) return;
  const button = $("delete-conversation");
  if (deleteArmed !== chat.id) {
    deleteArmed = chat.id;
    button.textContent = "Really delete?";
    setTimeout(() => {
      deleteArmed = null;
      button.textContent = "Delete";
    }, 5000);
    return;
  }
  const id = chat.id;
  deleteArmed = null;
  button.textContent = "Delete";
  try {
    await api.deleteConversation(id);
    list.items.delete(id);
    renderList();
    go(null);
  } catch (exc) {
    failed("Could not delete", exc);
  }
});

// --- messages ------------------------------------------------------------------------------------

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function meta(who, seconds) {
  const head = el("div", "msg-meta");
  head.append(el("span", "msg-who", who));
  if (seconds) {
    const time = el("time", "msg-time", timeText(seconds));
    time.dateTime = new Date(seconds * 1000).toISOString();
    head.append(time);
  }
  return head;
}

function image(part) {
  if (!IMAGE_TYPES.has(part.mime) || !/^[A-Za-z0-9+/=\s]*$/.test(part.data)) {
    return el("p", "muted", `[an image of type ${part.mime} is not shown]`);
  }
  const img = el("img", "msg-image");
  img.alt = "image";
  img.src = `data:${part.mime};base64,${part.data.replace(/\s/g, "")}`;
  return img;
}

function messageShell(tag, role, key) {
  const node = el(tag, `msg msg-${role}`);
  node.dataset.testid = "message";
  node.dataset.role = role;
  node.dataset.key = key;
  return node;
}

/** A text part: Markdown (the assistant's) or plain. A long one is shown cut at SHOWN_CHARS,
 * with a button for the whole: laying out a megabyte of text takes the browser about a second
 * on a slow machine (the renderer itself is linear, markdown.js), and a stored message must not
 * freeze every page that shows it. */
function textNodes(body, markdown) {
  const fill = (box, text) => {
    if (markdown) box.replaceChildren(renderMarkdown(text));
    else box.textContent = text;
  };
  const box = el("div", markdown ? "md" : "msg-text");
  if (body.length <= SHOWN_CHARS) {
    fill(box, body);
    return [box];
  }
  fill(box, body.slice(0, SHOWN_CHARS));
  const size = body.length >= 1e6 ? `${(body.length / 1e6).toFixed(1)} M` : `${Math.round(body.length / 1e3)} k`;
  const more = el("button", "link-button show-all", `… show all of it (${size} characters)`);
  more.type = "button";
  more.dataset.testid = "show-all";
  more.addEventListener("click", () => {
    fill(box, body);
    more.remove();
  });
  return [box, more];
}

function contentNodes(content, markdown) {
  const out = [];
  for (const part of content ?? []) {
    if (part.type === "text") {
      out.push(...textNodes(part.body, markdown));
    } else if (part.type === "image") {
      out.push(image(part));
    }
  }
  return out;
}

function reasoningNode(text) {
  const details = el("details", "reasoning");
  details.append(el("summary", null, "Reasoning"), el("div", "reasoning-text", text));
  return details;
}

function userNode(record, busy) {
  const node = messageShell("article", "user", record.id);
  node.append(meta("You", record.created_at));
  const body = el("div", "msg-body");
  if (editing === record.id) {
    const text = (record.message.content ?? []).filter((p) => p.type === "text").map((p) => p.body).join("\n");
    body.append(editor(text, (edited) => branchActions.save(record, edited), branchActions.cancel));
  } else {
    body.append(...contentNodes(record.message.content, false));
  }
  node.append(body);
  if (!chat.deleted) node.append(userControls(record, branchActions, busy));
  return node;
}

function assistantNode(record, controls) {
  const message = record.message;
  const node = messageShell("article", "assistant", record.id);
  const head = meta("Assistant", record.created_at);
  if (message.interrupted) {
    node.dataset.interrupted = "true";
    head.append(el("span", "badge", "interrupted"));
  }
  node.append(head);
  if (message.reasoning) node.append(reasoningNode(message.reasoning));
  const body = el("div", "msg-body");
  body.append(...contentNodes(message.content, true));
  if (!message.content?.length) body.append(el("p", "muted", "(no text)"));
  node.append(body);
  if (controls) node.append(controls);
  return node;
}

function pretty(json) {
  try {
    return JSON.stringify(JSON.parse(json), null, 2);
  } catch {
    return json;
  }
}

function toolNode(key, call, result, waiting = false) {
  const node = messageShell("details", "tool", key);
  const status = !result ? (waiting ? "waiting" : "running") : result.message.is_error ? "error" : "done";
  node.dataset.status = status;
  const name = (call ?? result).message.name || "(unnamed tool)";
  const summary = el("summary", "tool-summary");
  summary.append(
    el("span", "msg-who", "Tool"),
    el("code", "tool-name", name),
    el("span", `badge badge-${status}`, status === "done" ? "result" : status),
  );
  node.append(summary);
  if (call) {
    node.append(el("div", "tool-label", "Arguments"), el("pre", "tool-args", pretty(call.message.arguments)));
  }
  if (result) {
    node.append(el("div", "tool-label", result.message.is_error ? "Error" : "Result"),
      el("pre", "tool-result", result.message.content));
  }
  return node;
}

function errorNode(record, controls) {
  const node = messageShell("article", "error", record.id);
  node.setAttribute("role", "note");
  node.append(meta("Error", record.created_at));
  const text = el("p", "msg-text", record.message.message);
  node.append(text, el("p", "muted", `code: ${record.message.code}`));
  if (controls) node.append(controls);
  return node;
}

function interruptedNode(turnId) {
  const node = el("p", "notice-line", "The answer was interrupted before any text.");
  node.dataset.testid = "interrupted-notice";
  node.dataset.key = `interrupted:${turnId}`;
  return node;
}

function draftNode() {
  const draft = chat.draft;
  const node = messageShell("article", "assistant", "draft");
  node.dataset.draft = "true";
  node.setAttribute("aria-busy", draft.ended ? "false" : "true");
  node.append(meta("Assistant", 0));
  if (draft.reasoning) node.append(reasoningNode(draft.reasoning));
  const body = el("div", "msg-body");
  if (draft.text) {
    body.append(...textNodes(draft.text, true));
  } else if (!draft.images.length) {
    const dots = el("p", "typing", "Thinking…");
    body.append(dots);
  }
  for (const part of draft.images) body.append(image(part));
  if (draft.partial) {
    body.append(el("p", "muted", "Reconnected in the middle of this answer: some of it was missed "
      + "here; the whole answer shows when it is done."));
  }
  node.append(body);
  return node;
}

/** The message elements the chat should show, in order: [{key, sig, build}]. */
function wantedNodes() {
  const out = [];
  const items = chat.items();
  const results = new Map();
  const calls = new Set();
  const answers = new Map(); // call id -> the answer record of its pause
  for (const item of items) {
    if (item.kind !== "record") continue;
    const m = item.record.message;
    if (m.type === "tool_call") calls.add(m.call_id);
    if (m.type === "tool_result" && !results.has(m.call_id)) results.set(m.call_id, item.record);
    if (m.type === "approval_answer" || m.type === "input_answer") answers.set(m.call_id, item.record);
  }
  // the answer "Regenerate" is offered on: the last answer, when no message follows it
  let lastAnswer = null;
  for (const item of items) {
    const type = item.kind === "record" ? item.record.message.type : null;
    if (type === "assistant_message" || type === "error") lastAnswer = item.record.id;
    else if (type === "user_message") lastAnswer = null;
  }
  const busy = chat.running || chat.deleted;
  const versions = (r) => `${r.siblings ?? 1}:${r.sibling_index ?? 0}:${busy}`;
  const controls = (r) => (chat.deleted ? null
    : answerControls(r, branchActions, { last: r.id === lastAnswer, busy }));
  const paused = new Set(); // calls whose pause still waits for an answer
  for (const item of items) {
    const m = item.record?.message;
    if ((m?.type === "approval_request" || m?.type === "input_request") && !answers.has(m.call_id)
        && !chat.answered.has(m.turn_id)) paused.add(m.call_id);
  }
  let waiting = false;
  for (const item of items) {
    if (item.kind === "interrupted") {
      out.push({ key: `interrupted:${item.turnId}`, sig: "", build: () => interruptedNode(item.turnId) });
      continue;
    }
    const record = item.record;
    const m = record.message;
    switch (m.type) {
      case "user_message":
        out.push({ key: record.id, sig: `${versions(record)}:${editing === record.id}`,
          build: () => userNode(record, busy) });
        break;
      case "assistant_message":
        out.push({ key: record.id, sig: `${versions(record)}:${record.id === lastAnswer}`,
          build: () => assistantNode(record, controls(record)) });
        break;
      case "tool_call": {
        const result = results.get(m.call_id);
        const waits = paused.has(m.call_id);
        out.push({ key: record.id, sig: result?.id ?? (waits ? "waiting" : ""),
          build: () => toolNode(record.id, record, result, waits) });
        break;
      }
      case "tool_result":
        if (!calls.has(m.call_id) || results.get(m.call_id) !== record) {
          out.push({ key: record.id, sig: "", build: () => toolNode(record.id, null, record) });
        }
        break;
      case "error":
        out.push({ key: record.id, sig: `${versions(record)}:${record.id === lastAnswer}`,
          build: () => errorNode(record, controls(record)) });
        break;
      case "approval_request":
      case "input_request": {
        const answer = answers.get(m.call_id);
        const over = chat.answered.has(m.turn_id);
        waiting ||= paused.has(m.call_id);
        out.push({ key: record.id, sig: pauseSig(answer, over),
          build: () => pauseNode(record, answer, over, pauseActions(chat.id),
            (exc) => failed("Could not answer", exc)) });
        break;
      }
      default:
        break;
    }
  }
  // A turn that waits for a person is not thinking: its empty draft is not shown meanwhile.
  if (chat.draft && !(waiting && !chat.draft.text)) {
    out.push({ key: "draft", sig: null, build: draftNode });
  }
  return out;
}

/** What a pause's card does, for conversation `id` (the answer routes). */
function pauseActions(id) {
  return {
    approve: (callId, approve, reason) => api.approve(id, callId, approve, reason),
    answer: (callId, body) => api.answer(id, callId, body),
  };
}

function nearBottom(box) {
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

function renderChat() {
  const box = $("messages");
  renderHead();
  renderComposer();
  if (!chat) {
    box.replaceChildren($("placeholder") ?? placeholder());
    return;
  }
  const stick = nearBottom(box);
  const wanted = wantedNodes();
  const next = new Map();
  const children = [];
  for (const want of wanted) {
    const old = nodes.get(want.key);
    let node;
    if (old && want.sig !== null && old.sig === want.sig) {
      node = old.node;
    } else {
      node = want.build();
      // Keep a tool call open if the reader opened it.
      if (old?.node.open) node.open = true;
    }
    next.set(want.key, { node, sig: want.sig });
    children.push(node);
  }
  if (chat.deleted) children.push(el("p", "placeholder", "This conversation was deleted."));
  else if (!children.length) children.push(el("p", "placeholder", "No messages yet. Say something!"));
  nodes = next;
  // Move or insert only what is out of place (open <details>, selections and focus survive).
  let cursor = box.firstChild;
  for (const node of children) {
    if (node === cursor) {
      cursor = cursor.nextSibling;
    } else {
      box.insertBefore(node, cursor);
    }
  }
  while (cursor) {
    const after = cursor.nextSibling;
    cursor.remove();
    cursor = after;
  }
  if (stick) box.scrollTop = box.scrollHeight;
}

function placeholder() {
  const p = el("p", "placeholder", "Start a new conversation, or pick one from the list.");
  p.id = "placeholder";
  return p;
}

/** Streaming: redraw the draft at most once per frame. */
function scheduleDraft() {
  if (draftFrame) return;
  draftFrame = requestAnimationFrame(() => {
    draftFrame = 0;
    renderChat();
  });
}

// --- branches (docs/PROTOCOL.md "Branches") ----------------------------------------------------

/** Load the open chat's current branch again, keeping records newer than the snapshot (they
 * came by events while it was read). */
let reloads = 0;

async function reloadChat(id) {
  const mine = ++reloads; // only the last one started is applied: it reads the newest state
  try {
    const snapshot = await api.snapshot(id);
    if (chat?.id !== id || mine !== reloads) return;
    const newer = [...chat.records.values()].filter((r) => r.seq > snapshot.cursor.offset);
    chat.replace(snapshot);
    for (const r of newer) chat.records.set(r.id, r);
    renderChat();
  } catch (exc) {
    failed("Could not load the conversation", exc);
  }
}

/** A `branch_changed` event: the current branch moved (here or in another tab), so the page
 * reads it again; and once more when that turn has its answer, for its versions' counts. */
function followBranches(open, common) {
  const type = common.event.type;
  if (type === "branch_changed") {
    open.branchTurn = true;
    reloadChat(open.id);
  } else if (open.branchTurn && (type === "assistant_message" || type === "error" || type === "interrupted")) {
    open.branchTurn = false;
    reloadChat(open.id);
  }
}

const branchActions = {
  async step(record, delta) {
    const id = chat?.id;
    if (!id) return;
    try {
      const versions = await api.siblings(id, record.id);
      const at = versions.findIndex((v) => v.id === record.id);
      const target = versions[at + delta];
      if (at < 0 || !target) return;
      const snapshot = await api.branch(id, target.id);
      reloads++; // a reload under way read the branch before this switch
      if (chat?.id !== id) return;
      chat.replace(snapshot);
      renderChat();
    } catch (exc) {
      failed("Could not show that version", exc);
    }
  },
  startEdit(record) {
    editing = record.id;
    renderChat();
  },
  cancel() {
    editing = null;
    renderChat();
  },
  async save(record, text) {
    const id = chat?.id;
    if (!id) return;
    try {
      await api.edit(id, record.id, text);
      editing = null;
      renderChat();
    } catch (exc) {
      failed("Could not send the edit", exc);
    }
  },
  async regenerate(record) {
    if (!chat) return;
    try {
      await api.regenerate(chat.id, record.id);
    } catch (exc) {
      failed("Could not regenerate", exc);
    }
  },
};

// --- the composer --------------------------------------------------------------------------------

let sending = false;

function renderComposer() {
  const disabled = !chat ? false : chat.deleted;
  $("message-input").disabled = disabled;
  $("send").disabled = disabled || sending;
  $("stop").hidden = !chat?.running;
}

const input = $("message-input");

function autoGrow() {
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, 240)}px`;
}

input.addEventListener("input", autoGrow);
input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.altKey && !event.ctrlKey && !event.metaKey
      && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});

$("composer").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = input.value;
  if (!text.trim() || sending) return;
  sending = true;
  renderComposer();
  try {
    let id = chat && !chat.deleted ? chat.id : null;
    if (!id) {
      const record = await api.createConversation(undefined, chosenAgent());
      list.items.set(record.id, list.items.get(record.id) ?? record);
      go(record.id);
      id = record.id;
      // Bounded: with the socket down the message is still sent (its answer arrives through
      // the conversation stream once the page is live again).
      await connection.whenLive(id, LIVE_WAIT_MS);
    }
    const untitled = chat?.id === id && chat.records.size === 0 && !list.items.get(id)?.title;
    await api.send(id, text);
    clearTransientNotice();
    if (untitled) autoTitle(id, text);
    if (input.value === text) {
      input.value = "";
      autoGrow();
    }
  } catch (exc) {
    if (exc instanceof ApiError && exc.code === "mailbox_full") {
      notify("Too many messages are waiting for an answer; try again in a moment.", true);
    } else {
      failed("Could not send", exc);
    }
  } finally {
    sending = false;
    renderComposer();
    input.focus();
  }
});

/** Name an untitled conversation after its first message (its first line, shortened). */
function autoTitle(id, text) {
  const line = text.trim().split("\n")[0].trim();
  const title = line.length > 48 ? `${line.slice(0, 47).trimEnd()}…` : line;
  if (!title) return;
  api.renameConversation(id, title).catch(() => {}); // only a convenience
}

$("stop").addEventListener("click", async () => {
  if (!chat) return;
  try {
    await api.interrupt(chat.id);
  } catch (exc) {
    failed("Could not stop", exc);
  }
});

// --- the sidebar on small screens ----------------------------------------------------------------

function closeSidebar() {
  $("app").classList.remove("sidebar-open");
  $("toggle-sidebar").setAttribute("aria-expanded", "false");
  $("scrim").hidden = true;
}

$("toggle-sidebar").addEventListener("click", () => {
  const open = !$("app").classList.contains("sidebar-open");
  $("app").classList.toggle("sidebar-open", open);
  $("toggle-sidebar").setAttribute("aria-expanded", String(open));
  $("scrim").hidden = !open;
  if (open) $("new-conversation").focus();
});
$("scrim").addEventListener("click", closeSidebar);
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && $("app").classList.contains("sidebar-open")) closeSidebar();
});

// --- start ---------------------------------------------------------------------------------------

/** For people (and tests) who script the page: read-only views of the sync state. */
window.agentik = Object.freeze({
  get stats() {
    return { ...connection.stats };
  },
  get state() {
    return connection.state;
  },
  get conversationId() {
    return chat?.id ?? null;
  },
  get cursors() {
    return { agent: connection.agentCursor, chat: connection.chat?.cursor ?? null };
  },
  get retryDelays() {
    return [...connection.delays];
  },
});

$("change-token").hidden = !api.token;
openChat(routeId());
renderChat();
connection.start();
