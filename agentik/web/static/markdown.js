// Markdown to DOM nodes, for untrusted text (the model's output).
//
// Everything is built with createElement / createTextNode: no HTML in the text is ever parsed,
// so `<img onerror=...>` or `<script>` in an answer shows up as those characters. Links keep
// only http:, https: and mailto: targets; images are shown as links (an image would make the
// browser fetch whatever the model names). Supported: paragraphs (single newlines are line
// breaks), headings, fenced and indented code blocks (with a copy button), block quotes, ordered
// and unordered lists (nested by indentation), tables (GitHub's pipe tables, with alignment),
// horizontal rules, and inline (inline.js): **bold**, *italic*, ~~strike~~, `code`,
// [links](url), <autolinks> and bare http(s) URLs, backslash escapes. An unterminated code fence
// (an answer still streaming) runs to the end of the text. The time taken is linear in the text
// (inline.js says how; a block is decided from its own line and the next).

import { MAX_DEPTH, renderInline } from "./inline.js";

// Block starts are matched at the line's start only; what follows is taken apart by hand (a
// regex with a lazy or optional middle part and an end anchor is quadratic on long lines).
const FENCE = /^ {0,3}(`{3,}|~{3,})/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]|$)/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])([ \t]+|$)(.*)$/;
const INDENTED = /^(?: {4}|\t)/;
const DELIMITER_CELL = /^[ \t]*(:?)-+(:?)[ \t]*$/;
// wider "tables" are shown as text
const MAX_COLUMNS = 64;

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
    if ((m = fenceAt(line))) {
      const body = [];
      i++;
      while (i < lines.length && !isFenceEnd(lines[i], m.marker)) body.push(lines[i++]);
      i++; // the closing fence (or past the end)
      parent.append(codeBlock(body.join("\n"), m.lang));
      continue;
    }
    if ((m = headingAt(line))) {
      const h = el(`h${Math.min(6, m.level + 2)}`, "md-h");
      renderInline(m.text, h, depth);
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
    if (tableAt(lines, i)) {
      i = renderTable(lines, i, parent, depth);
      continue;
    }
    // A paragraph: up to a blank line or the start of another block (a table too).
    const body = [line];
    i++;
    while (i < lines.length && !blank(lines[i]) && !startsBlock(lines[i]) && !tableAt(lines, i)) {
      body.push(lines[i++]);
    }
    // One text for the whole paragraph (emphasis may span its lines); its newlines are shown
    // as line breaks by the style (white-space: pre-line), not as one <br> node each.
    const p = el("p");
    renderInline(body.map((text) => text.trim()).join("\n"), p, depth);
    parent.append(p);
  }
}

function startsBlock(line) {
  return fenceAt(line) !== null || HEADING.test(line) || RULE.test(line) || QUOTE.test(line)
    || ITEM.test(line);
}

/** A code fence's opening line: its marker and the info string's first word (no backticks
 * after the marker), or null. */
function fenceAt(line) {
  const m = FENCE.exec(line);
  if (!m) return null;
  const info = line.slice(m[0].length);
  if (info.includes("`")) return null;
  return { marker: m[1], lang: info.trim().split(/\s/, 1)[0] };
}

/** An ATX heading: its level and its text without the closing #s, or null. */
function headingAt(line) {
  const m = HEADING.exec(line);
  if (!m) return null;
  let text = line.slice(m[0].length).trim();
  let end = text.length;
  while (end > 0 && text[end - 1] === "#") end--;
  if (end === 0) text = "";
  else if (text[end - 1] === " " || text[end - 1] === "\t") text = text.slice(0, end).trimEnd();
  return { level: m[1].length, text };
}

function isFenceEnd(line, marker) {
  const trimmed = line.trim();
  return trimmed.length >= marker.length && trimmed[0] === marker[0]
    && [...trimmed].every((c) => c === marker[0]);
}

function codeBlock(text, lang) {
  const box = el("div", "md-codeblock");
  const pre = el("pre", "md-code");
  const code = el("code");
  if (lang && /^[\w+#.-]{1,32}$/.test(lang)) code.dataset.lang = lang;
  code.textContent = text;
  pre.append(code);
  const copy = el("button", "md-copy");
  copy.type = "button";
  copy.textContent = "Copy";
  copy.title = "Copy the code";
  copy.dataset.testid = "copy-code";
  copy.addEventListener("click", () => copyCode(code, copy));
  box.append(copy, pre);
  return box;
}

/** Copy the code block's text; without the clipboard API (a page served over plain http to
 * another host is not a secure context), by selecting it and the browser's copy command. */
async function copyCode(code, button) {
  let copied = false;
  try {
    await navigator.clipboard.writeText(code.textContent);
    copied = true;
  } catch {
    const range = document.createRange();
    range.selectNodeContents(code);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    try {
      copied = document.execCommand("copy");
    } catch {
      copied = false;
    }
    selection.removeAllRanges();
  }
  button.textContent = copied ? "Copied" : "Select and copy";
  button.dataset.copied = String(copied);
  setTimeout(() => {
    button.textContent = "Copy";
    delete button.dataset.copied;
  }, 2000);
}

// --- tables (GitHub's pipe tables) -------------------------------------------------------------

/** A table's cells: the line split at each unescaped `|`, the outer pipes optional. `\|` stays
 * escaped (the inline renderer shows it as `|`). */
function cells(line) {
  const text = line.trim();
  const out = [];
  let start = 0;
  for (let j = 0; j < text.length; j++) {
    if (text[j] === "\\") j++;
    else if (text[j] === "|") {
      out.push(text.slice(start, j));
      start = j + 1;
    }
  }
  out.push(text.slice(start));
  if (text.startsWith("|")) out.shift();
  if (out.length > 1 && out[out.length - 1].trim() === "" && text.endsWith("|")) out.pop();
  return out.map((cell) => cell.trim());
}

/** The column alignments if lines[i] is a table's header row and lines[i + 1] its delimiter
 * row (`| --- | :-: |`: pipes, as many cells as the header), else null. */
function tableAt(lines, i) {
  const head = lines[i];
  const rule = lines[i + 1];
  if (rule === undefined || !head.includes("|") || !rule.includes("|") || !rule.includes("-")) {
    return null;
  }
  const delimiters = cells(rule);
  if (delimiters.length > MAX_COLUMNS || cells(head).length !== delimiters.length) return null;
  const align = [];
  for (const cell of delimiters) {
    const m = DELIMITER_CELL.exec(cell);
    if (!m) return null;
    align.push(m[1] && m[2] ? "center" : m[2] ? "right" : m[1] ? "left" : "");
  }
  return align;
}

/** The table starting at lines[start]; returns the index of the first line after it. */
function renderTable(lines, start, parent, depth) {
  const align = tableAt(lines, start);
  const row = (line, tag) => {
    const tr = el("tr");
    const values = cells(line);
    align.forEach((how, n) => {
      const cell = el(tag, how ? `md-${how}` : "");
      renderInline(values[n] ?? "", cell, depth);
      tr.append(cell);
    });
    return tr;
  };
  const table = el("table", "md-table");
  const head = el("thead");
  head.append(row(lines[start], "th"));
  table.append(head);
  let i = start + 2;
  const body = el("tbody");
  while (i < lines.length && !blank(lines[i]) && !startsBlock(lines[i])) body.append(row(lines[i++], "td"));
  if (body.childNodes.length) table.append(body);
  // Wide tables scroll on their own, not the page.
  const wrap = el("div", "md-table-wrap");
  wrap.append(table);
  parent.append(wrap);
  return i;
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

