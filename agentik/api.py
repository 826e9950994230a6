"""What the two implementations of the Agent API keep alike, written once: the in-process agent
(:mod:`agentik.agent`) and the HTTP client (:mod:`agentik.client`). Transport-free, so both
import it (the client loads nothing of the server through it).

- :func:`as_content`: what a ``send`` accepts (a str is one Text; empty content is refused);
- :class:`ConversationView`: a conversation handle: its record's fields, and the calls it makes
  through its agent (send, interrupt, approve, answer, rename, close);
- :func:`decode_input` / :func:`convert_input` / :func:`decode_client_json`: a client's JSON
  into wire types, every way it can fail an InvalidInputError (what the web facade reads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from agentik.errors import InvalidInputError
from agentik.wire import (
    ChatSnapshot,
    Content,
    ConversationRecord,
    Image,
    MessageContext,
    MessageRecord,
    Text,
)

T = TypeVar("T")


def as_content(content: Sequence[Content] | Content | str) -> list[Content]:
    """A send's content as a list: a str is one Text, one item a list of it. Raises
    InvalidInputError for empty content."""
    if isinstance(content, str):
        return [Text(body=content)]
    if isinstance(content, Text | Image):
        return [content]
    # a list as it is: the one shape content keeps from here to the stored records
    items = content if isinstance(content, list) else list(content)
    if not items:
        raise InvalidInputError("content must not be empty")
    return items


class ConversationOwner(Protocol):
    """The agent calls a conversation handle makes (LocalAgent, AgentikAgent)."""

    async def send(
        self,
        conversation_id: str,
        content: Sequence[Content] | Content | str,
        context: MessageContext | None = None,
        *,
        on_busy: str | None = None,
        idempotency_key: str | None = None,
    ) -> str: ...

    async def interrupt(self, conversation_id: str) -> bool: ...

    async def approve(self, conversation_id: str, call_id: str, approve: bool = True,
                      reason: str | None = None) -> MessageRecord: ...

    async def answer(self, conversation_id: str, call_id: str, text: str | None = None, *,
                     data: dict[str, Any] | None = None) -> MessageRecord: ...

    async def rename_conversation(
        self, conversation_id: str, title: str | None
    ) -> ConversationRecord: ...

    async def edit(
        self, conversation_id: str, message_id: str, content: Sequence[Content] | Content | str,
        context: MessageContext | None = None, *, on_busy: str | None = None,
        idempotency_key: str | None = None,
    ) -> str: ...

    async def regenerate(self, conversation_id: str, message_id: str, *,
                         on_busy: str | None = None, idempotency_key: str | None = None
                         ) -> str: ...

    async def switch_branch(self, conversation_id: str, message_id: str, *,
                            on_busy: str | None = None, idempotency_key: str | None = None
                            ) -> ChatSnapshot: ...

    async def fork(self, conversation_id: str, message_id: str, *, title: str | None = None,
                   idempotency_key: str | None = None) -> ConversationView[Any]: ...

    async def siblings(self, conversation_id: str, message_id: str
                       ) -> list[MessageRecord]: ...


A = TypeVar("A", bound=ConversationOwner)


class ConversationView(Generic[A]):
    """A handle on one conversation: the fields of its record, and the calls it makes through
    its agent. The in-process (``LocalConversation``) and the HTTP (``HttpConversation``)
    handles add how they read messages."""

    def __init__(self, agent: A, record: ConversationRecord) -> None:
        self._agent = agent
        self.record = record
        self._closed = False

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def title(self) -> str | None:
        return self.record.title

    @property
    def is_temporal(self) -> bool:
        return self.record.is_temporal

    @property
    def agent(self) -> str:
        """The id of the agent it belongs to."""
        return self.record.agent

    async def send(
        self,
        content: Sequence[Content] | Content | str,
        context: MessageContext | None = None,
        *,
        on_busy: str | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Queue a user message; returns its id once it is stored. The answer arrives as events.
        ``on_busy``: queue | reject | interrupt (default: the server's AGENTIK_BUSY_POLICY); an
        ``idempotency_key`` already used for this send returns the first message's id.
        Raises MailboxFullError, BusyError, NotFoundError, ConversationFailedError,
        IdempotencyKeyReusedError, StorageError."""
        return await self._agent.send(self.id, content, context, on_busy=on_busy,
                                      idempotency_key=idempotency_key)

    async def interrupt(self) -> bool:
        """Cancel the running turn (Interrupted event). Returns whether a turn was running."""
        return await self._agent.interrupt(self.id)

    async def approve(self, call_id: str, approve: bool = True, reason: str | None = None
                      ) -> MessageRecord:
        """Answer the approval the paused call ``call_id`` waits for (an ``approval_requested``
        event): approved, the tool runs; refused, the model is told so, with ``reason``.
        Returns the stored answer (the same answer again returns it again). Raises
        NotFoundError, ConflictError (answered otherwise, or its turn has ended)."""
        return await self._agent.approve(self.id, call_id, approve, reason)

    async def answer(self, call_id: str, text: str | None = None, *,
                     data: dict[str, Any] | None = None) -> MessageRecord:
        """Answer the question the paused call ``call_id`` asks (an ``input_requested``
        event): ``text``, or ``data`` for a structured answer; as :meth:`approve` otherwise."""
        return await self._agent.answer(self.id, call_id, text, data=data)

    # branches (docs/PROTOCOL.md "Branches")

    async def edit(self, message_id: str, content: Sequence[Content] | Content | str,
                   context: MessageContext | None = None, *, on_busy: str | None = None,
                   idempotency_key: str | None = None) -> str:
        """A new version of the user message ``message_id``, answered on the branch it is on
        (the current branch moves to it); returns the new message's id."""
        return await self._agent.edit(self.id, message_id, content, context, on_busy=on_busy,
                                      idempotency_key=idempotency_key)

    async def regenerate(self, message_id: str, *, on_busy: str | None = None,
                         idempotency_key: str | None = None) -> str:
        """A new answer to the user message ``message_id`` answers (or is); returns the new
        turn's id (its events carry it)."""
        return await self._agent.regenerate(self.id, message_id, on_busy=on_busy,
                                            idempotency_key=idempotency_key)

    async def switch_branch(self, message_id: str, *, on_busy: str | None = None,
                            idempotency_key: str | None = None) -> ChatSnapshot:
        """Make the version ``message_id`` current (with the newest path below it); returns
        the conversation as it then is."""
        return await self._agent.switch_branch(self.id, message_id, on_busy=on_busy,
                                               idempotency_key=idempotency_key)

    async def fork(self, message_id: str, *, title: str | None = None,
                   idempotency_key: str | None = None) -> ConversationView[Any]:
        """A new conversation whose history is this one's up to ``message_id``."""
        return await self._agent.fork(self.id, message_id, title=title,
                                      idempotency_key=idempotency_key)

    async def siblings(self, message_id: str) -> list[MessageRecord]:
        """Every version at ``message_id``'s place, oldest first."""
        return await self._agent.siblings(self.id, message_id)

    async def rename(self, title: str | None) -> ConversationRecord:
        self.record = await self._agent.rename_conversation(self.id, title)
        return self.record

    async def close(self) -> None:
        """Release this handle (idempotent). The conversation itself stays; see delete."""
        self._closed = True


# --- a client's JSON -----------------------------------------------------------------------------


def convert_input(data: Any, into: type[T]) -> T:
    """Validate already-parsed data (e.g. a JSON body) into a wire type.

    Raises InvalidInputError carrying msgspec's message, which names the offending path.
    """
    try:
        return msgspec.convert(data, into)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(str(exc)) from None


#: what a client is told when its JSON nests deeper than the decoder's recursion limit
TOO_DEEP = "invalid JSON: nested too deeply"


def decode_input(raw: bytes | str, into: type[T]) -> T:
    """Decode and validate JSON into a wire type; InvalidInputError on bad JSON or bad shape."""
    return decode_client_json(partial(msgspec.json.decode, type=into), raw)


def decode_client_json(decode: Callable[[bytes | str], T], raw: bytes | str) -> T:
    """``decode(raw)`` for JSON from a client: every way it can fail is an InvalidInputError
    (msgspec's message names the path; a document nested deeper than msgspec's recursion limit,
    e.g. 100,000 ``[``, raises RecursionError, which must be a 400, never a 500)."""
    try:
        return decode(raw)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidInputError(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise InvalidInputError(TOO_DEEP) from None
