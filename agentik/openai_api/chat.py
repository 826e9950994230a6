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
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass

from agentik.errors import InvalidInputError, UnsupportedParameterError
from agentik.openai_api.types import ChatMessage, ChatRequest
from agentik.wire import (
    AssistantMessage,
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
    if req.tools or req.functions:
        param = "tools" if req.tools else "functions"
        raise UnsupportedParameterError(
            param, "client-side tools are not supported yet: the agent runs its own tools "
                   "server-side; send the request without `tools`")
    for name, value in (("tool_choice", req.tool_choice), ("function_call", req.function_call)):
        if value not in (None, "none", "auto"):
            raise UnsupportedParameterError(name, f"{name} needs client-side tools, which are "
                                                  "not supported yet")
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


def split_messages(req: ChatRequest) -> tuple[list[Entry], list[Content]]:
    """The caller's history and the new turn's content. Raises InvalidInputError."""
    if not req.messages:
        raise InvalidInputError("messages must hold at least one message")
    history: list[Entry] = []
    for i, message in enumerate(req.messages):
        where = f"messages[{i}]"
        if message.role in ("tool", "function") or message.tool_calls:
            raise UnsupportedParameterError(
                "messages", f"{where}: tool messages belong to client-side tools, which are "
                            "not supported yet")
        role = ROLES.get(message.role)
        if role is None:
            raise InvalidInputError(f"{where}: role must be system, developer, user or "
                                    f"assistant, got {message.role!r}")
        content = content_of(message, where)
        if i == len(req.messages) - 1:
            if role != "user":
                raise InvalidInputError(f"{where}: the last message must be the user's new "
                                        f"message, got role {message.role!r}")
            if not content:
                raise InvalidInputError(f"{where}: the new message is empty")
            return history, content
        history.append(entry_of(role, content))
    raise AssertionError("unreachable")


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
    given = [e for e in sent if e.role != "system"]
    if not given and not whole:
        return True
    return given == [e for e in stored if e.role != "system"]


def branch_of(sent: Sequence[Entry], new: Sequence[Content], records: Sequence[MessageRecord]
              ) -> tuple[str, str] | None:
    """What a request whose history differs from the stored branch (``records``, in seq order)
    asks for: when its history is the stored one up to a turn (every turn before it, seeded
    entries first), the new message is an edit of that turn's user message, or, the same text
    again, a regenerate of its answer: ("edit" | "regenerate", that user message's id). None:
    the history differs elsewhere (a 409). System messages are not compared."""
    given = [e for e in sent if e.role != "system"]
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
