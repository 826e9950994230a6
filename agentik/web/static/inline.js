// Inline Markdown to DOM nodes (the part of markdown.js inside a paragraph, heading, list item or
// table cell), for untrusted text.
//
// Linear in the text. Every look ahead (the `]` closing a `[`, the `)` after it, an emphasis
// closer, a code span's closing run, an autolink's end) is answered from a table built in one
// pass over the text, the first time it is needed, or by a sticky regex that stops where the
// construct can no longer match. Searching ahead from every opener instead made text that opens
// much and closes nothing (`[[[[`, `![![`, `*a *a `, `_x _x `) quadratic: 1 MB of `[` froze a tab
// for minutes.

const ESCAPABLE = "\\`*_{}[]()#+-.!~<>|\"'";
const SAFE_URL = /^(https?:\/\/|mailto:)/i;
const AUTOLINK = /<((?:https?:\/\/|mailto:)[^\s<>]+)>/iy;
const BARE_URL = /https?:\/\/[^\s<>"'`]+/iy;
const URL_TRAILER = ".,;:!?)]";
const SPACE = /\s/;
const WORD = /\w/;
export const MAX_DEPTH = 8;

/** Render the inline Markdown `text` into `parent` (a DOM element). */
export function renderInline(text, parent, depth) {
  const ahead = new Ahead(text);
  let buffer = "";
  let plain = 0; // text[plain, i) is plain text not yet in `buffer`
  const flush = (i) => {
    buffer += text.slice(plain, i);
    if (buffer) parent.append(document.createTextNode(buffer));
    buffer = "";
  };
  let i = 0;
  while (i < text.length) {
    const span = special(text, i, depth, ahead);
    if (span === null) {
      i++;
    } else {
      if (span.escaped !== undefined) {
        buffer += text.slice(plain, i) + span.escaped;
      } else {
        flush(i);
        span.render(parent);
      }
      i = plain = span.end;
    }
  }
  flush(text.length);
}

/** The inline construct starting at text[i] ({end, render(parent)} or {end, escaped}), or null. */
function special(text, i, depth, ahead) {
  const c = text[i];
  const next = text[i + 1];
  if (c === "\\") {
    return next !== undefined && ESCAPABLE.includes(next) ? { end: i + 2, escaped: next } : null;
  }
  if (c === "`") return codeSpan(text, i, ahead);
  if (depth < MAX_DEPTH && (c === "*" || c === "_" || c === "~")) {
    const span = emphasis(text, i, ahead);
    if (span) {
      return {
        end: span.end,
        render(parent) {
          const node = document.createElement(span.tag);
          renderInline(span.inner, node, depth + 1);
          parent.append(node);
        },
      };
    }
    return null;
  }
  if ((c === "!" && next === "[") || c === "[") {
    // An image is never loaded: it is shown as a link to it (or as its alt text).
    const image = c === "!";
    const link = linkAt(text, image ? i + 1 : i, ahead);
    if (!link) return null;
    return {
      end: link.end,
      render(parent) {
        if (image) appendLink(parent, link.url, `image: ${link.label || link.url}`, depth, true);
        else appendLink(parent, link.url, link.label, depth, false);
      },
    };
  }
  if (c === "<") {
    AUTOLINK.lastIndex = i;
    const m = AUTOLINK.exec(text);
    if (!m) return null;
    return { end: i + m[0].length, render: (parent) => appendLink(parent, m[1], m[1], depth, true) };
  }
  if ((c === "h" || c === "H") && (i === 0 || /[\s(]/.test(text[i - 1]))) {
    BARE_URL.lastIndex = i;
    const m = BARE_URL.exec(text);
    if (!m) return null;
    let n = m[0].length;
    while (n > 0 && URL_TRAILER.includes(m[0][n - 1])) n--; // trailing punctuation is prose
    const url = m[0].slice(0, n);
    return { end: i + n, render: (parent) => appendLink(parent, url, url, depth, true) };
  }
  return null;
}

function codeSpan(text, i, ahead) {
  let run = 1;
  while (text[i + run] === "`") run++;
  // The closing run: the next occurrence of as many backticks, if any run that long follows.
  const end = ahead.longestTicksFrom(i + run) >= run ? text.indexOf("`".repeat(run), i + run) : -1;
  if (end < 0) return { end: i + run, escaped: "`".repeat(run) };
  let inner = text.slice(i + run, end);
  if (inner.length > 1 && inner[0] === " " && inner[inner.length - 1] === " ") {
    inner = inner.slice(1, -1);
  }
  return {
    end: end + run,
    render(parent) {
      const code = document.createElement("code");
      code.textContent = inner;
      parent.append(code);
    },
  };
}

/** `*em*`, `_em_`, `**strong**`, `__strong__`, `~~del~~` opening at text[i], or null. */
function emphasis(text, i, ahead) {
  const c = text[i];
  const double = text[i + 1] === c;
  if (c === "~" && !double) return null;
  const marker = double ? c + c : c;
  const start = i + marker.length;
  const next = text[start];
  if (next === undefined || SPACE.test(next)) return null;
  // Intraword underscores (snake_case) are not emphasis.
  if (c === "_" && i > 0 && WORD.test(text[i - 1])) return null;
  const j = ahead.closer(marker, start + 1);
  if (j < 0) return null;
  const tag = c === "~" ? "del" : double ? "strong" : "em";
  return { tag, inner: text.slice(start, j), end: j + marker.length };
}

/** Whether `marker` at text[j] can close an emphasis: after a visible, unescaped character; a
 * single marker not part of a double one (`*a **b** c*`); `_` not inside a word. */
function closes(text, j, marker) {
  const c = marker[0];
  const before = text[j - 1];
  if (before === undefined || SPACE.test(before) || before === "\\") return false;
  if (marker.length === 1) {
    if (text[j + 1] === c || before === c) return false;
  } else if (text[j + 1] !== c) {
    return false;
  }
  return !(c === "_" && WORD.test(text[j + marker.length] ?? ""));
}

/** `[label](url)` at text[i] === "[" (brackets may nest), or null. */
function linkAt(text, i, ahead) {
  const j = ahead.closeBracket(i);
  if (j < 0 || text[j + 1] !== "(") return null;
  const close = ahead.nextParen(j + 2);
  if (close < 0) return null;
  const target = text.slice(j + 2, close).trim();
  const url = target.split(/\s+/)[0].replace(/^<(.*)>$/, "$1");
  return { label: text.slice(i + 1, j), url, end: close + 1 };
}

function appendLink(parent, url, label, depth, plainLabel) {
  if (!SAFE_URL.test(url)) {
    // javascript:, data:, relative or anything else: the text only.
    if (plainLabel) parent.append(document.createTextNode(label));
    else renderInline(label, parent, depth + 1);
    return;
  }
  const a = document.createElement("a");
  a.href = url;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  if (plainLabel) a.textContent = label;
  else renderInline(label, a, depth + 1);
  parent.append(a);
}

/** The look-ahead tables of one text, each built in one pass the first time it is asked for. */
class Ahead {
  constructor(text) {
    this.text = text;
    this.brackets = null;
    this.parens = null;
    this.ticks = null;
    this.closers = new Map();
  }

  /** The `]` closing the `[` at i (brackets nest; `\` escapes the next character), or -1. */
  closeBracket(i) {
    if (this.brackets === null) {
      const text = this.text;
      const match = new Int32Array(text.length).fill(-1);
      const open = [];
      for (let j = 0; j < text.length; j++) {
        const ch = text[j];
        if (ch === "\\") j++;
        else if (ch === "[") open.push(j);
        else if (ch === "]" && open.length) match[open.pop()] = j;
      }
      this.brackets = match;
    }
    return this.brackets[i];
  }

  /** The first `)` at or after `from`, or -1. */
  nextParen(from) {
    if (this.parens === null) this.parens = nextWhere(this.text, (j) => this.text[j] === ")");
    return from < this.text.length ? this.parens[from] : -1;
  }

  /** The longest run of backticks starting at or after `from`. */
  longestTicksFrom(from) {
    if (this.ticks === null) {
      const text = this.text;
      const longest = new Int32Array(text.length + 1);
      let run = 0;
      for (let j = text.length - 1; j >= 0; j--) {
        run = text[j] === "`" ? run + 1 : 0;
        longest[j] = Math.max(run, longest[j + 1]);
      }
      this.ticks = longest;
    }
    return from < this.text.length ? this.ticks[from] : 0;
  }

  /** The first place at or after `from` where `marker` closes an emphasis, or -1. */
  closer(marker, from) {
    let table = this.closers.get(marker);
    if (table === undefined) {
      const text = this.text;
      table = nextWhere(text, (j) => text[j] === marker[0] && closes(text, j, marker));
      this.closers.set(marker, table);
    }
    return from < this.text.length ? table[from] : -1;
  }
}

/** next[j] = the first k >= j with test(k), or -1 (one pass from the end). */
function nextWhere(text, test) {
  const next = new Int32Array(text.length);
  let found = -1;
  for (let j = text.length - 1; j >= 0; j--) {
    if (test(j)) found = j;
    next[j] = found;
  }
  return next;
}
