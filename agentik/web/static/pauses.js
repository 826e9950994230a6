// A turn that waits for a person (docs/PROTOCOL.md, "A person in the loop"): the approval card
// (the tool, its arguments, Approve / Deny with a reason) and the question card (the question,
// its choices as buttons, a text box, or a form for an elicitation's schema). Each is built from
// its journal record (approval_request / input_request), so a reload (the snapshot) shows a
// pause still waiting; once its answer is in the journal (from this page or any other client),
// or its turn has ended, the card gives way to one line saying how it went.
// Model output is untrusted: everything reaches the page as text nodes.

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, testid, className = "pause-button") {
  const b = el("button", className, label);
  b.type = "button";
  b.dataset.testid = testid;
  return b;
}

function pretty(json) {
  try {
    return JSON.stringify(JSON.parse(json), null, 2);
  } catch {
    return json;
  }
}

function deadlineNode(deadline, what) {
  if (!deadline) return [];
  const at = new Date(deadline * 1000);
  return [el("p", "muted", `${what} at ${at.toLocaleTimeString()} without an answer.`)];
}

/** While a click's request is out, the card's controls are disabled; a failure enables them. */
function busy(card, act, onError) {
  const controls = card.querySelectorAll("button, input, select, textarea");
  for (const c of controls) c.disabled = true;
  act().catch((exc) => {
    for (const c of controls) c.disabled = false;
    onError(exc);
  });
}

/** The line that replaces a card: how the pause ended. */
function outcomeNode(request, answer) {
  const m = answer?.message;
  let text;
  if (!m) text = request.type === "approval_request"
    ? `${request.tool}: no answer was given (the turn ended).`
    : "The question was not answered (the turn ended).";
  else if (m.type === "approval_answer") {
    if (m.approve) text = `Approved: ${request.tool}`;
    else if (m.timed_out) text = `Denied: ${request.tool} (no answer came in time)`;
    else text = `Denied: ${request.tool}${m.reason ? ` (${m.reason})` : ""}`;
  } else if (m.timed_out) text = "The question was not answered in time.";
  else if (m.data) text = `Answered: ${JSON.stringify(m.data)}`;
  else text = `Answered: ${m.text ?? ""}`;
  const node = el("p", "notice-line", text);
  node.dataset.testid = "pause-outcome";
  return node;
}

function approvalCard(request, act, onError) {
  const card = el("section", "pause-card");
  card.dataset.testid = "approval-card";
  card.dataset.callId = request.call_id;
  card.setAttribute("role", "group");
  card.setAttribute("aria-label", `Approve the tool ${request.tool}?`);
  const head = el("p", "pause-title");
  head.append(el("span", null, "Approve this tool call? "), el("code", "tool-name", request.tool));
  const reason = el("input", "pause-input");
  reason.type = "text";
  reason.placeholder = "Reason (told to the model when you deny)";
  reason.dataset.testid = "deny-reason";
  reason.setAttribute("aria-label", "Reason");
  const approve = button("Approve", "approve", "pause-button primary");
  const deny = button("Deny", "deny");
  approve.addEventListener("click", () => busy(card, () => act.approve(request.call_id, true, null), onError));
  deny.addEventListener("click", () => busy(card, () => act.approve(request.call_id, false,
    reason.value.trim() || null), onError));
  const row = el("div", "pause-row");
  row.append(reason, approve, deny);
  card.append(head, el("pre", "tool-args", pretty(request.arguments)),
    ...deadlineNode(request.deadline, "It is denied"), row);
  return card;
}

/** The form of an elicitation's schema: one field per property (text, number, checkbox, or a
 * list for an enum); its value as the structured answer. */
function schemaForm(schema) {
  const fields = [];
  const box = el("div", "pause-form");
  for (const [name, prop] of Object.entries(schema?.properties ?? {})) {
    const label = el("label", "pause-field");
    label.append(el("span", null, prop.title || prop.description || name));
    let input;
    if (Array.isArray(prop.enum)) {
      input = el("select", "pause-input");
      for (const option of prop.enum) input.append(el("option", null, String(option)));
    } else {
      input = el("input", "pause-input");
      input.type = prop.type === "boolean" ? "checkbox"
        : prop.type === "number" || prop.type === "integer" ? "number" : "text";
      if (prop.default !== undefined) {
        if (input.type === "checkbox") input.checked = Boolean(prop.default);
        else input.value = String(prop.default);
      }
    }
    input.dataset.testid = `field-${name}`;
    input.name = name;
    label.append(input);
    box.append(label);
    fields.push([name, prop, input]);
  }
  const value = () => {
    const data = {};
    for (const [name, prop, input] of fields) {
      if (input.type === "checkbox") data[name] = input.checked;
      else if (input.type === "number") {
        if (input.value !== "") data[name] = Number(input.value);
      } else if (input.value !== "" || (schema.required ?? []).includes(name)) data[name] = input.value;
      if (prop.type === "integer" && typeof data[name] === "number") data[name] = Math.trunc(data[name]);
    }
    return data;
  };
  return { box, value };
}

function questionCard(request, act, onError) {
  const card = el("section", "pause-card");
  card.dataset.testid = "question-card";
  card.dataset.callId = request.call_id;
  card.setAttribute("role", "group");
  card.setAttribute("aria-label", "A question for you");
  card.append(el("p", "pause-title", request.question));
  const send = (body) => busy(card, () => act.answer(request.call_id, body), onError);
  if (request.choices?.length) {
    const row = el("div", "pause-row");
    for (const choice of request.choices) {
      const b = button(choice, "choice");
      b.addEventListener("click", () => send({ text: choice }));
      row.append(b);
    }
    card.append(row);
  }
  if (request.schema) {
    const form = schemaForm(request.schema);
    const submit = button("Send", "answer-send", "pause-button primary");
    submit.addEventListener("click", () => send({ data: form.value() }));
    const decline = button("Decline", "decline");
    decline.addEventListener("click", () => send({ text: "declined" }));
    const row = el("div", "pause-row");
    row.append(submit, decline);
    card.append(form.box, row, ...deadlineNode(request.deadline, "It is cancelled"));
    return card;
  }
  const input = el("input", "pause-input");
  input.type = "text";
  input.placeholder = request.choices?.length ? "Or write another answer" : "Your answer";
  input.dataset.testid = "answer-input";
  input.setAttribute("aria-label", "Your answer");
  const submit = button("Answer", "answer-send", "pause-button primary");
  const go = () => {
    if (input.value.trim()) send({ text: input.value.trim() });
  };
  submit.addEventListener("click", go);
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.isComposing) {
      event.preventDefault();
      go();
    }
  });
  const row = el("div", "pause-row");
  row.append(input, submit);
  card.append(row, ...deadlineNode(request.deadline, "It goes unanswered"));
  return card;
}

/**
 * The node of a pause's record: its card while it waits, else the line saying how it ended.
 * `answer`: the answer's record (or undefined); `over`: its turn has ended; `act`: {approve(callId,
 * approve, reason), answer(callId, body)} returning promises; `onError(exc)` when one fails.
 */
export function pauseNode(record, answer, over, act, onError) {
  const request = record.message;
  let node;
  if (answer || over) node = outcomeNode(request, answer);
  else if (request.type === "approval_request") node = approvalCard(request, act, onError);
  else node = questionCard(request, act, onError);
  node.dataset.key = record.id;
  return node;
}

/** The signature a pause's node is rebuilt on: while open it is kept (typed text survives). */
export function pauseSig(answer, over) {
  return answer ? answer.id : over ? "over" : "open";
}
