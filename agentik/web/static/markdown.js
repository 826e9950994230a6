// Markdown to DOM nodes, for untrusted text (the model's output).
//
// Everything is built with createElement / createTextNode: no HTML in the text is ever parsed,
// so `<img onerror=...>` or `<script>` in an answer shows up as those characters. Links keep
// only http:, https: and mailto: targets; images are shown as links (an image would make the
// browser fetch whatever the model names). Supported: paragraphs (single newlines are line
// breaks), headings, fenced and indented code blocks, block quotes, ordered and unordered lists
// (nested by indentation), horizontal rules, **bold**, *italic*, ~~strike~~, `code`, [links](url),
// <autolinks> and bare http(s) URLs, backslash escapes. An unterminated code fence (an answer
// still streaming) runs to the end of the text.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])([ \t]+|$)(.*)$/;
const INDENTED = /^(?: {4}|\t)/;
const MAX_DEPTH = 8;

/** Render `text` as Markdown into a DocumentFragment. */
export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  renderBlocks(String(text ?? "").replace(/\r\n?/g, "\n").split("\n"), fragment, 0);
  return fragment;
}

function el(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

function blank(line) {
  return line.trim() === "";
}

function renderBlocks(lines, parent, depth) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (blank(line)) {
      i++;
      continue;
    }
    let m;
    if ((m = FENCE.exec(line))) {
      const marker = m[1];
      const body = [];
      i++;
      while (i < lines.length && !isFenceEnd(lines[i], marker)) body.push(lines[i++]);
      i++; // the closing fence (or past the end)
      parent.append(codeBlock(body.join("\n"), m[2]));
      continue;
    }
    if ((m = HEADING.exec(line))) {
      const h = el(`h${Math.min(6, m[1].length + 2)}`, "md-h");
      renderInline(m[2] ?? "", h, depth);
      parent.append(h);
      i++;
      continue;
    }
    if (RULE.test(line)) {
      parent.append(el("hr"));
      i++;
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && !blank(lines[i]) && QUOTE.test(lines[i])) {
        body.push(lines[i++].replace(QUOTE, ""));
      }
      const quote = el("blockquote");
      if (depth < MAX_DEPTH) renderBlocks(body, quote, depth + 1);
      else quote.append(document.createTextNode(body.join("\n")));
      parent.append(quote);
      continue;
    }
    if ((m = ITEM.exec(line))) {
      i = renderList(lines, i, parent, depth);
      continue;
    }
    if (INDENTED.test(line)) {
      const body = [];
      while (i < lines.length && (INDENTED.test(lines[i]) || blank(lines[i]))) {
        body.push(lines[i++].replace(INDENTED, ""));
      }
      while (body.length && blank(body[body.length - 1])) body.pop();
      parent.append(codeBlock(body.join("\n"), ""));
      continue;
    }
    // A paragraph: up to a blank line or the start of another block.
    const body = [line];
    i++;
    while (i < lines.length && !blank(lines[i]) && !startsBlock(lines[i])) body.push(lines[i++]);
    const p = el("p");
    body.forEach((text, n) => {
      if (n > 0) p.append(el("br"));
      renderInline(text.trim(), p, depth);
    });
    parent.append(p);
  }
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line)
    || ITEM.test(line);
}

function isFenceEnd(line, marker) {
  const trimmed = line.trim();
  return trimmed.length >= marker.length && trimmed[0] === marker[0]
    && [...trimmed].every((c) => c === marker[0]);
}

function codeBlock(text, lang) {
  const pre = el("pre", "md-code");
  const code = el("code");
  if (lang && /^[\w+#.-]{1,32}$/.test(lang)) code.dataset.lang = lang;
  code.textContent = text;
  pre.append(code);
  return pre;
}

/** A list starting at lines[start]; returns the index of the first line after it. */
function renderList(lines, start, parent, depth) {
  const first = ITEM.exec(lines[start]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = el(ordered ? "ol" : "ul");
  if (ordered) {
    const n = parseInt(first[2], 10);
    if (n !== 1) list.start = n;
  }
  let i = start;
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    // The item's own text, then every line indented past the marker (or a lazy continuation).
    const contentIndent = indent + m[2].length + Math.max(1, m[3].length);
    const body = [m[4]];
    i++;
    while (i < lines.length) {
      const next = lines[i];
      if (blank(next)) {
        // A blank line continues the item only if indented content follows.
        const after = lines[i + 1];
        if (after !== undefined && !blank(after) && leading(after) >= contentIndent) {
          body.push("");
          i++;
          continue;
        }
        break;
      }
      const lead = leading(next);
      if (lead >= contentIndent || (lead > indent && ITEM.test(next))) {
        body.push(next.slice(Math.min(lead, contentIndent)));
      } else if (!startsBlock(next) && lead > indent) {
        body.push(next.trim());
      } else if (!startsBlock(next) && !ITEM.test(next) && body.length === 1) {
        body.push(next.trim()); // a lazy continuation of the first line
      } else {
        break;
      }
      i++;
    }
    const li = el("li");
    if (depth < MAX_DEPTH && body.length > 1) {
      renderBlocks(body, li, depth + 1);
      // A tight item's single paragraph is shown without the paragraph's margins.
      if (li.childNodes.length && li.firstChild.tagName === "P") li.firstChild.classList.add("md-tight");
    } else {
      renderInline(body.join(" ").trim(), li, depth);
    }
    list.append(li);
    while (i < lines.length && blank(lines[i])) {
      const after = lines[i + 1];
      const next = after === undefined ? null : ITEM.exec(after);
      if (next && next[1].length === indent) i++;
      else break;
    }
  }
  parent.append(list);
  return i;
}

function leading(line) {
  return line.length - line.trimStart().length;
}

// --- inline --------------------------------------------------------------------------------------

const ESCAPABLE = "\\`*_{}[]()#+-.!~<>|\"'";
const SAFE_URL = /^(https?:\/\/|mailto:)/i;
const BARE_URL = /^https?:\/\/[^\s<>"'`]+/i;

function renderInline(text, parent, depth) {
  let buffer = "";
  const flush = () => {
    if (buffer) parent.append(document.createTextNode(buffer));
    buffer = "";
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === "\\" && i + 1 < text.length && ESCAPABLE.includes(text[i + 1])) {
      buffer += text[i + 1];
      i += 2;
      continue;
    }
    if (c === "`") {
      const run = /^`+/.exec(text.slice(i))[0];
      const end = text.indexOf(run, i + run.length);
      if (end > 0) {
        flush();
        const code = el("code");
        let inner = text.slice(i + run.length, end);
        if (/^ .* $/.test(inner)) inner = inner.slice(1, -1);
        code.textContent = inner;
        parent.append(code);
        i = end + run.length;
        continue;
      }
      buffer += run;
      i += run.length;
      continue;
    }
    if (depth < MAX_DEPTH && (c === "*" || c === "_" || c === "~")) {
      const span = emphasis(text, i);
      if (span) {
        flush();
        const node = el(span.tag);
        renderInline(span.inner, node, depth + 1);
        parent.append(node);
        i = span.end;
        continue;
      }
    }
    if (c === "!" && text[i + 1] === "[") {
      // An image: never loaded; shown as a link to it (or its alt text).
      const link = linkAt(text, i + 1);
      if (link) {
        flush();
        appendLink(parent, link.url, `image: ${link.label || link.url}`, depth, true);
        i = link.end;
        continue;
      }
    }
    if (c === "[") {
      const link = linkAt(text, i);
      if (link) {
        flush();
        appendLink(parent, link.url, link.label, depth, false);
        i = link.end;
        continue;
      }
    }
    if (c === "<") {
      const m = /^<((?:https?:\/\/|mailto:)[^\s<>]+)>/i.exec(text.slice(i));
      if (m) {
        flush();
        appendLink(parent, m[1], m[1], depth, true);
        i += m[0].length;
        continue;
      }
    }
    if ((c === "h" || c === "H") && (i === 0 || /[\s(]/.test(text[i - 1]))) {
      const m = BARE_URL.exec(text.slice(i));
      if (m) {
        const url = m[0].replace(/[.,;:!?)\]]+$/, "");
        flush();
        appendLink(parent, url, url, depth, true);
        i += url.length;
        continue;
      }
    }
    buffer += c;
    i++;
  }
  flush();
}

function emphasis(text, i) {
  const c = text[i];
  const double = text[i + 1] === c;
  if (c === "~" && !double) return null;
  const marker = double ? c + c : c;
  const start = i + marker.length;
  const next = text[start];
  if (next === undefined || /\s/.test(next)) return null;
  // Intraword underscores (snake_case) are not emphasis.
  if (c === "_" && i > 0 && /\w/.test(text[i - 1])) return null;
  let j = start;
  while (true) {
    j = text.indexOf(marker, j + 1);
    if (j < 0) return null;
    if (!/\s/.test(text[j - 1]) && text[j - 1] !== "\\") {
      if (!double && text[j + 1] === c) {
        // `*a **b** c*`: skip the inner double marker
        j += 1;
        continue;
      }
      if (c === "_" && /\w/.test(text[j + marker.length] ?? "")) continue;
      break;
    }
  }
  const tag = c === "~" ? "del" : double ? "strong" : "em";
  return { tag, inner: text.slice(start, j), end: j + marker.length };
}

/** `[label](url)` at text[i] === "[" (brackets may nest), or null. */
function linkAt(text, i) {
  let level = 0;
  let j = i;
  for (; j < text.length; j++) {
    const ch = text[j];
    if (ch === "\\") {
      j++;
      continue;
    }
    if (ch === "[") level++;
    else if (ch === "]" && --level === 0) break;
  }
  if (j >= text.length || text[j + 1] !== "(") return null;
  const close = text.indexOf(")", j + 2);
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
  const a = el("a");
  a.href = url;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  if (plainLabel) a.textContent = label;
  else renderInline(label, a, depth + 1);
  parent.append(a);
}
