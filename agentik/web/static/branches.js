// Branches in the web chat (docs/PROTOCOL.md "Branches"): edit a user message, regenerate the last
// answer, and the version arrows `< 2 / 3 >` of a message with several versions. Each control is
// built here and calls back into app.js (`actions`), which talks to the server and redraws.

const el = (tag, className, text) => {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
};

function button(testid, label, title, onClick) {
  const b = el("button", "link-button msg-action", label);
  b.type = "button";
  b.dataset.testid = testid;
  b.title = title;
  b.addEventListener("click", onClick);
  return b;
}

/** `< i / n >` for a record with several versions (null when it has one). */
export function versionArrows(record, actions) {
  const count = record.siblings ?? 1;
  if (count < 2) return null;
  const index = record.sibling_index ?? 0;
  const box = el("span", "versions");
  box.dataset.testid = "versions";
  const prev = button("version-prev", "‹", "Previous version", () => actions.step(record, -1));
  const next = button("version-next", "›", "Next version", () => actions.step(record, 1));
  prev.disabled = index === 0;
  next.disabled = index >= count - 1;
  const label = el("span", "version-label", `${index + 1} / ${count}`);
  label.dataset.testid = "version-label";
  box.append(prev, label, next);
  return box;
}

/** The controls under a user message: its versions and "Edit". */
export function userControls(record, actions, busy) {
  const bar = el("div", "msg-actions");
  const arrows = versionArrows(record, actions);
  if (arrows) bar.append(arrows);
  const edit = button("edit", "Edit", "Edit this message and get a new answer", () => actions.startEdit(record));
  edit.disabled = busy;
  bar.append(edit);
  return bar;
}

/** The controls under an answer: its versions, and "Regenerate" on the last answer. */
export function answerControls(record, actions, { last, busy }) {
  const arrows = versionArrows(record, actions);
  if (!arrows && !last) return null;
  const bar = el("div", "msg-actions");
  if (arrows) bar.append(arrows);
  if (last) {
    const again = button("regenerate", "Regenerate", "Answer this again", () => actions.regenerate(record));
    again.disabled = busy;
    bar.append(again);
  }
  return bar;
}

/** The editor that replaces a user message's text while it is edited. */
export function editor(text, onSave, onCancel) {
  const form = el("form", "msg-editor");
  const area = el("textarea", "msg-edit-input");
  area.dataset.testid = "edit-input";
  area.value = text;
  area.rows = Math.min(10, Math.max(2, text.split("\n").length));
  const save = el("button", "primary", "Save & send");
  save.type = "submit";
  save.dataset.testid = "edit-save";
  const cancel = button("edit-cancel", "Cancel", "Keep the message as it is", onCancel);
  form.append(area, el("div", "msg-actions", undefined));
  form.lastChild.append(save, cancel);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (area.value.trim()) onSave(area.value);
  });
  area.addEventListener("keydown", (event) => {
    if (event.key === "Escape") onCancel();
  });
  queueMicrotask(() => area.focus());
  return form;
}
