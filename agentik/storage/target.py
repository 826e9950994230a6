"""What an engine provides to the ops of one batch (:class:`Target`): the primitives every op
of ``storage/apply.py`` is written against (its docstring says how the two engines provide
them). Kept apart from the ops so each side reads on its own: ``apply.py`` what each op does,
this the contract an engine keeps (``mypy`` refuses an engine that lacks a primitive)."""

from __future__ import annotations

from typing import Protocol, TypeVar

from agentik.storage import ops
from agentik.wire import (
    AgentEvent,
    ApprovalGiven,
    ApprovalRequested,
    AssistantMessageEvent,
    BranchChanged,
    ConversationRecord,
    DurableEvent,
    ErrorEvent,
    InputGiven,
    InputRequested,
    Message,
    MessageRecord,
    ToolCallEvent,
    ToolFailed,
    ToolResultEvent,
    UserMessageEvent,
    WorkingItem,
)

Rec = TypeVar("Rec")

#: the events that carry a journal record (``Target.journal``)
RecordEvent = (UserMessageEvent | AssistantMessageEvent | ToolCallEvent | ToolResultEvent
               | ToolFailed | ErrorEvent | ApprovalRequested | ApprovalGiven | InputRequested
               | InputGiven | BranchChanged)


class Target(Protocol[Rec]):
    """What an engine provides to the ops of one batch (see the module docstring)."""

    #: the batch's time: every time it stores
    now: float

    # --- checks and reads -------------------------------------------------------------------

    def require(self, conversation_id: str) -> None:
        """NotFoundError unless the conversation exists (as the batch left it so far)."""

    def exists(self, conversation_id: str) -> bool: ...

    def idempotency(self, key: str) -> tuple[str, str] | None:
        """(fingerprint, result id) stored under ``key`` and not expired, or None."""

    def task_seq(self, task_id: str) -> int | str | None:
        """The A2A task's stored seq (None: no such task), or why it cannot be compared."""

    def open_turns(self, conversation_id: str | None) -> list[tuple[str, str]]:
        """The running turns (conversation id, turn id) of live conversations, of one
        conversation or of all, in the order they came (queued ones are not: ``recover_turns``)."""

    def turn_calls(self, conversation_id: str, turn_id: str) -> list[Message]:
        """The tool calls and results stored after the turn's user message, in order (those of
        the turn carry its id): a running turn's calls without a result (``recover_turns``)."""

    def temporary(self) -> list[str]:
        """The temporary conversations to purge (start-up)."""

    def stored_records(self, ids: tuple[str, ...]) -> list[MessageRecord]:
        """Those of the journal records ``ids`` already stored, in that order (a recheck)."""

    def turn_open(self, conversation_id: str, turn_id: str) -> bool: ...

    def started(self, conversation_id: str, turn_id: str) -> bool:
        """Whether the turn's user item is in working memory (a recheck)."""

    def compacted(self, op: ops.Compact) -> bool:
        """Whether ``op`` is stored (a recheck: ``ops.compacted``)."""

    def webhook_exists(self, webhook_id: str) -> bool: ...

    # --- writes -------------------------------------------------------------------------------

    def alloc(self) -> int:
        """The next offset of the batch."""

    def emit(self, seq: int, conversation_id: str | None,
             event: DurableEvent | AgentEvent) -> None:
        """The durable event at ``seq`` (its outbox kind from its class: ``types.kind_of``)."""

    def journal(self, conversation_id: str, message_id: str, message: Message,
                event: type[RecordEvent]) -> Rec:
        """The message's record at the next offset, with its event; the conversation's seq
        bumped to it. NotFoundError if the conversation does not exist: checked before the
        offset is taken (the hot path needs no ``require`` of its own)."""

    def new_conversation(self, op: ops.CreateConversation, seq: int) -> ConversationRecord:
        """The conversation's row at ``seq``; its record as its Created event carries it."""

    def rename(self, conversation_id: str, title: str | None, seq: int) -> None: ...

    def bump(self, conversation_id: str, seq: int, *, touch: bool = False) -> None:
        """The conversation's seq (and with ``touch`` its updated_at) set to ``seq``."""

    def remember(self, conversation_id: str, item: WorkingItem, source: str | None) -> None:
        """``item`` appended to working memory (``source``: the message it came from)."""

    def forget(self, conversation_id: str, from_idx: int) -> None:
        """The working-memory items with order_idx >= ``from_idx`` removed."""

    def compact(self, conversation_id: str, before_idx: int, summary: WorkingItem | None) -> None:
        """The items between the system prompt and ``before_idx`` replaced by ``summary``."""

    def open_turn(self, conversation_id: str, turn_id: str, running: bool, user: Rec) -> None:
        """The turn's row, at its user message's offset (``user``: its record)."""

    def run_turn(self, conversation_id: str, turn_id: str, *, waiting: bool = False) -> None:
        """The turn's row set running (``waiting``: waiting for a person: ``ops.AnswerPause``)."""

    def close_turn(self, conversation_id: str, turn_id: str) -> None: ...

    def drop_turns(self, conversation_id: str | None) -> None:
        """The running turns of one conversation or of all removed (after ``open_turns``), and
        any turn of a conversation gone."""

    def drop_conversation(self, conversation_id: str) -> str:
        """The conversation's rows removed: journal, working memory, turns, A2A tasks and
        their push configs; returns the agent it belonged to."""

    def put_task(self, op: ops.PutA2ATask, seq: int) -> None: ...

    def put_webhook(self, op: ops.PutWebhook, new: bool) -> None:
        """A new row (progress after ``op.after``), else its definition replaced."""

    def drop_webhook(self, webhook_id: str) -> None: ...

    def webhook_progress(self, op: ops.WebhookProgress) -> None:
        """As ``ops.WebhookProgress`` says (failing since ``now`` from the first failure)."""

    def keep_key(self, idem: ops.Idempotency, result_id: str) -> None:
        """``idem`` stored with the write whose result is ``result_id``."""

    def own(self, conversation_id: str, user: str) -> None:
        """The conversation is ``user``'s (docs/USERS.md): kept after it is deleted."""

    def count_tokens(self, conversation_id: str, tokens: int) -> None:
        """``tokens`` added to the conversation's user's count of this UTC day (none: no
        user)."""

    # --- results ------------------------------------------------------------------------------

    def value(self, value: object) -> object: ...

    def conversation(self, conversation_id: str) -> object:
        """The conversation's record as the op left it."""

    def offset(self, seq: int) -> object: ...
