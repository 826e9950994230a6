"""Chat Completions as pure decisions (no I/O): which parameters agentik refuses, what a request's
messages mean for a conversation, and whether the history a caller sends is the stored one.

- A request's *last* message is the new turn; it must be a user message. Everything before it is
  the caller's history, as :class:`Entry` items (role, text, how many images).
- Continuing a conversation, that history must be the stored one (:func:`transcript` of its
  current branch), or empty (the caller need not repeat it); or it stops short of the stored
  one at a turn, whose user message the new one edits or repeats (:func:`branch_of`: an edit or
  a regenerate, docs/PROTOCOL.md "Branches"); anything else is a 409.
- Seeding a new conversation, the history reaches the model as one text block ahead of the new
  message (:func:`seed_content`); the entries are kept in the user message's context metadata
  (``openai_seed``), so :func:`transcript` gives the caller's own history back and the next
  request of the same exchange matches it.
- Client-side tools (``tools``, :func:`client_tools`): the caller's own, offered to the model for
  the turn; a request whose last messages are ``tool`` results (:class:`ToolAnswer`) answers
  the calls its turn waits on instead of starting one. Tool calls and results in a history are
  not compared with the stored one (the stored transcript has the turns' answers only).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from agentik.errors import InvalidInputError, UnsupportedParameterError
from agentik.openai_api.types import ChatMessage, ChatRequest
from agentik.wire import (
    AssistantMessage,
    ClientTool,
    Content,
    Image,
    MessageContext,
    MessageOrigin,
    MessageRecord,
    Text,
    UserMessage,
)

#: context metadata key holding a seeded turn's history (JSON list of [role, text, images])
SEED_KEY = "openai_seed"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
#: history roles of a client-side tool's exchange, left out of the history check
TOOL_ROLES = frozenset({"tool", "tool_calls"})
#: a function name as OpenAI allows it
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class ToolAnswer:
    """A ``tool`` message ending a request: the result of the client-side call it names."""

    tool_call_id: str
    text: str


@dataclass(frozen=True)
class Entry:
    """One message of a transcript as the history check compares it."""

    role: str  # system | user | assistant
    text: str
    images: int = 0


def check_supported(req: ChatRequest) -> None:
    """Refuse what agentik cannot honour (UnsupportedParameterError, 400), rather than answering
    something the caller did not ask for. Sampling settings (temperature, top_p, max_tokens, ...)
    are the agent's own and are ignored (docs/OPENAI.md)."""
    if req.n is not None and req.n != 1:
        raise UnsupportedParameterError("n", "n must be 1: an agent gives one answer per turn")
    if req.functions or req.function_call is not None:
        raise UnsupportedParameterError(
            "functions", "the legacy functions / function_call are not supported: declare "
                         "client-side tools in `tools`")
    if req.tool_choice not in (None, "none", "auto"):
        raise UnsupportedParameterError("tool_choice", "tool_choice may be auto or none: the "
                                                       "agent's model chooses its tools")
    if req.logprobs or req.top_logprobs:
        raise UnsupportedParameterError("logprobs", "logprobs are not available from an agent")
    if req.response_format is not None and req.response_format.get("type", "text") != "text":
        raise UnsupportedParameterError("response_format", "only response_format text is "
                                                           "supported")
    if req.modalities is not None and any(m != "text" for m in req.modalities):
        raise UnsupportedParameterError("modalities", "only the text modality is supported")
    if req.audio is not None:
        raise UnsupportedParameterError("audio", "audio output is not supported")
    if req.stop:
        raise UnsupportedParameterError("stop", "stop sequences are not supported: the agent "
                                                "answers whole turns")
    if req.logit_bias:
        raise UnsupportedParameterError("logit_bias", "logit_bias is not supported")
    if req.prediction is not None:
        raise UnsupportedParameterError("prediction", "predicted outputs are not supported")


def client_tools(req: ChatRequest, own: Collection[str]) -> list[ClientTool] | None:
    """The request's ``tools`` (the caller's own; None without them, or with tool_choice none).
    Raises InvalidInputError naming a malformed one, or one named like a tool of the agent's
    own (``own``), which would be ambiguous."""
    if not req.tools or req.tool_choice == "none":
        return None
    out: list[ClientTool] = []
    for i, tool in enumerate(req.tools):
        where = f"tools[{i}]"
        fn: Any = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise InvalidInputError(f'{where}: a tool must be {{"type": "function", "function": '
                                    '{"name", "description", "parameters"}}')
        name, description = fn.get("name"), fn.get("description") or ""
        parameters = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
            raise InvalidInputError(f"{where}.function.name must be 1 to 64 letters, digits, _ "
                                    "or -")
        if not isinstance(description, str) or not isinstance(parameters, dict):
            raise InvalidInputError(f"{where}.function: description must be a string and "
                                    "parameters a JSON schema object")
        if name in own:
            raise InvalidInputError(f"{where}: the agent has a tool of its own named {name!r}")
        if any(t.name == name for t in out):
            raise InvalidInputError(f"{where}: two tools are named {name!r}")
        out.append(ClientTool(name=name, description=description, parameters=parameters))
    return out


def _tool_calls_text(calls: list[Any], where: str) -> str:
    """An assistant message's calls of client-side tools, as history text."""
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidInputError(f"{where}.tool_calls[{j}]: a call needs function.name")
        out.append(f"[called {fn['name']} with {fn.get('arguments') or '{}'}]")
    return " ".join(out)


def _image(url: str, where: str) -> Image:
    """A data: URL as an Image (the image rules are checked by every send)."""
    head, sep, data = url.partition(",")
    if not url.startswith("data:") or not sep or not head.endswith(";base64"):
        raise InvalidInputError(f"{where}: an image must be a data: URL with base64 content "
                                "(data:image/png;base64,...); links are not fetched")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInputError(f"{where}: the image's base64 content is malformed") from None
    return Image(data=data, mime=head.removeprefix("data:").removesuffix(";base64"))


def content_of(message: ChatMessage, where: str) -> list[Content]:
    """A message's content as agentik content: text parts and data-URL images."""
    if message.content is None:
        return []
    if isinstance(message.content, str):
        return [Text(body=message.content)] if message.content else []
    out: list[Content] = []
    for i, part in enumerate(message.content):
        at = f"{where}.content[{i}]"
        if part.type == "text" and part.text is not None:
            out.append(Text(body=part.text))
        elif part.type == "image_url" and part.image_url is not None:
            out.append(_image(part.image_url.url, at))
        else:
            raise InvalidInputError(f"{at}: a part must be text or image_url, got {part.type!r}")
    return out


def entry_of(role: str, content: Sequence[Content]) -> Entry:
    text = "".join(c.body for c in content if isinstance(c, Text))
    return Entry(role=role, text=text, images=sum(isinstance(c, Image) for c in content))


def split_messages(req: ChatRequest) -> tuple[list[Entry], list[Content], list[ToolAnswer]]:
    """The caller's history, and either the new turn's content or the ``tool`` results that end
    the request (the answers of the calls its turn waits on). Raises InvalidInputError."""
    if not req.messages:
        raise InvalidInputError("messages must hold at least one message")
    answers: list[ToolAnswer] = []
    last = len(req.messages)
    while last and req.messages[last - 1].role == "tool":
        last -= 1
    for i, message in enumerate(req.messages[last:], start=last):
        if not message.tool_call_id:
            raise InvalidInputError(f"messages[{i}]: a tool message needs its tool_call_id")
        answers.append(ToolAnswer(message.tool_call_id,
                                  entry_of("tool", content_of(message, f"messages[{i}]")).text))
    history: list[Entry] = []
    for i, message in enumerate(req.messages[:last]):
        where = f"messages[{i}]"
        role = ROLES.get(message.role) or ("tool" if message.role == "tool" else None)
        if role is None:
            raise InvalidInputError(f"{where}: role must be system, developer, user, assistant "
                                    f"or tool, got {message.role!r}")
        content = content_of(message, where)
        if i == len(req.messages) - 1:
            if role != "user":
                raise InvalidInputError(f"{where}: the last message must be the user's new "
                                        f"message (or tool results), got role {message.role!r}")
            if not content:
                raise InvalidInputError(f"{where}: the new message is empty")
            return history, content, []
        entry = entry_of(role, content)
        if message.tool_calls:
            calls = _tool_calls_text(message.tool_calls, where)
            entry = Entry(role="tool_calls", text=f"{entry.text} {calls}".strip())
        history.append(entry)
    return history, [], answers


def seed_content(
    history: Sequence[Entry], new: Sequence[Content], origin: str
) -> tuple[list[Content], MessageContext]:
    """A new conversation's first turn: the caller's history as one text block ahead of the new
    message (none without history), and the context that records it."""
    metadata: dict[str, str] = {"openai_api": origin}
    if not history:
        return list(new), MessageContext(origin=MessageOrigin(kind="user"), metadata=metadata)
    lines = ["The conversation so far, as the client sent it:"]
    for item in history:
        images = f" [{item.images} image(s) not repeated]" if item.images else ""
        lines.append(f"[{item.role}]{images}\n{item.text}")
    lines.append("[end of the conversation so far; the new message follows]\n\n")
    metadata[SEED_KEY] = json.dumps([[e.role, e.text, e.images] for e in history],
                                    ensure_ascii=False)
    return ([Text(body="\n\n".join(lines)), *new],
            MessageContext(origin=MessageOrigin(kind="user"), metadata=metadata))


def seeded_of(message: UserMessage) -> tuple[list[Entry], list[Content]] | None:
    raw = None if message.context is None else message.context.metadata.get(SEED_KEY)
    if raw is None:
        return None
    try:
        items = json.loads(raw)
        seed = [Entry(role=str(r), text=str(t), images=int(n)) for r, t, n in items]
    except (ValueError, TypeError):
        return None
    return seed, list(message.content[1:])


def turns_of(records: Sequence[MessageRecord]) -> list[tuple[UserMessage, str, AssistantMessage | None]]:
    """A conversation's current branch (its records in seq order) as its turns: each user
    message (its id), and its answer when it has one. An answer names its turn: its user
    message's id, or a regenerate's own id (docs/PROTOCOL.md "Branches"), which on a branch is
    the answer to the last user message before it still without one."""
    turns: list[tuple[UserMessage, str, AssistantMessage | None]] = []
    where: dict[str, int] = {}
    for record in records:
        message = record.message
        if isinstance(message, UserMessage):
            where[record.id] = len(turns)
            turns.append((message, record.id, None))
        elif isinstance(message, AssistantMessage):
            at = where.get(message.turn_id or "")
            if at is None:  # a regenerate's
                at = next((i for i in range(len(turns) - 1, -1, -1) if turns[i][2] is None), None)
            if at is not None:
                turns[at] = (turns[at][0], turns[at][1], message)
    return turns


def transcript(records: Sequence[MessageRecord]) -> list[Entry]:
    """A conversation's current branch as the caller's history: seeded entries, then each
    answered turn's user message and answer (a turn that failed without an answer is left out,
    as the caller never got one; tool calls and results are the agent's own)."""
    out: list[Entry] = []
    for message, _, answer in turns_of(records):
        seeded = seeded_of(message)
        content = message.content if seeded is None else seeded[1]
        if seeded is not None:
            out.extend(seeded[0])
        if answer is not None:
            out += [entry_of("user", content), entry_of("assistant", answer.content)]
    return out


def history_matches(sent: Sequence[Entry], stored: Sequence[Entry], *, whole: bool = False
                    ) -> bool:
    """The caller's history is the stored one, or none at all (unless ``whole``: a caller that
    always sends the whole exchange, as Open WebUI does, so a regenerated first answer is told
    from a new message). System and developer messages are not compared: a conversation keeps
    the instructions it started with."""
    given = [e for e in sent if e.role != "system" and e.role not in TOOL_ROLES]
    if not given and not whole:
        return True
    return given == [e for e in stored if e.role != "system" and e.role not in TOOL_ROLES]


def branch_of(sent: Sequence[Entry], new: Sequence[Content], records: Sequence[MessageRecord]
              ) -> tuple[str, str] | None:
    """What a request whose history differs from the stored branch (``records``, in seq order)
    asks for: when its history is the stored one up to a turn (every turn before it, seeded
    entries first), the new message is an edit of that turn's user message, or, the same text
    again, a regenerate of its answer: ("edit" | "regenerate", that user message's id). None:
    the history differs elsewhere (a 409). System messages are not compared."""
    given = [e for e in sent if e.role != "system" and e.role not in TOOL_ROLES]
    stored: list[Entry] = []
    for message, message_id, answer in turns_of(records):
        seeded = seeded_of(message)
        if seeded is not None:
            stored.extend(e for e in seeded[0] if e.role != "system")
        content = message.content if seeded is None else seeded[1]
        if answer is None:
            continue
        if given == stored:
            same = entry_of("user", new) == entry_of("user", content)
            return ("regenerate" if same else "edit", message_id)
        stored += [entry_of("user", content), entry_of("assistant", answer.content)]
    return None
