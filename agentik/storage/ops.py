"""Write operations the StorageActor accepts: a closed union of frozen structs.

What each op checks, reads and writes is defined once, for both engines, in
``storage/apply.py``; every durable event it produces takes the next value of the counter, and
the state rows it writes carry that same value, so ``event offset == record seq`` holds by
construction. Ops carry no timestamps: every time stored by a batch is the writer's clock at
that batch (one value per transaction).
"""

from __future__ import annotations

import msgspec

from agentik.errors import InvalidInputError
from agentik.storage.op_base import Idempotency as Idempotency
from agentik.storage.op_base import Op as Op
from agentik.storage.op_base import OpT as OpT
from agentik.storage.op_base import Replayed as Replayed
from agentik.storage.op_base import replay as replay
from agentik.storage.ops_branch import ForkConversation as ForkConversation
from agentik.storage.ops_branch import Regenerate as Regenerate
from agentik.storage.ops_branch import ResetMemory as ResetMemory
from agentik.storage.ops_branch import SourcedItems as SourcedItems
from agentik.storage.ops_branch import SwitchBranch as SwitchBranch
from agentik.wire import (
    AssistantMessage,
    ConversationRecord,
    Error,
    MessageRecord,
    Pause,
    PauseAnswer,
    ToolCall,
    ToolResult,
    UserMessage,
    WorkingItem,
)


class CreateConversation(Op[ConversationRecord | Replayed], frozen=True, kw_only=True):
    conversation_id: str
    title: str | None
    is_temporal: bool
    system_prompt: str
    idempotency: Idempotency | None = None
    #: the agent it belongs to, and the instructions given in place of its agent's (if any)
    agent: str = "default"
    instructions: str | None = None
    #: the user it belongs to (docs/USERS.md), stored in ``conversation_user``; None: no user's
    owner: str | None = None


class DeleteConversation(Op[bool], frozen=True, kw_only=True):
    conversation_id: str


class RenameConversation(Op[ConversationRecord], frozen=True, kw_only=True):
    conversation_id: str
    title: str | None


class AppendUserMessage(Op[MessageRecord | Replayed], frozen=True, kw_only=True):
    """Journal the user's message and open its turn (working memory gets it when the turn starts,
    so queued messages never interleave with a running turn's answer).

    ``start``: the turn starts in the same transaction (what a later :class:`StartTurn` of this
    message would do: ``start`` enters working memory, the turn row is stored running). Only for
    a message to an idle conversation, whose turn is next with nothing before it (issue 13: one
    commit per turn fewer); not done for a replayed idempotency key."""

    conversation_id: str
    message_id: str
    message: UserMessage
    idempotency: Idempotency | None = None
    start: WorkingItem | None = None
    #: an edit (docs/PROTOCOL.md "Branches"): the user message this one is a new version of; a
    #: BranchPoint record is journaled just before it (the tree's rule: ``actors/branches.py``)
    edit_of: str | None = None


class StartTurn(Op[None], frozen=True, kw_only=True):
    """The turn's user item into working memory (``source_message_id`` = the turn id, which is
    its user message's id) and its turn row set running."""

    conversation_id: str
    turn_id: str
    #: None: a regenerate's turn, whose user message is in working memory already
    item: WorkingItem | None
    #: a retry after StorageOutcomeUnknownError (:func:`rechecked`)
    recheck: bool = False


class AppendToolCalls(Op[list[MessageRecord]], frozen=True, kw_only=True):
    """One model round's tool calls: journal + events, one assistant item in working memory
    (none, and no calls: a question a tool server asks during a call, an elicitation)."""

    conversation_id: str
    calls: tuple[tuple[str, ToolCall], ...]  # (message id, call)
    item: WorkingItem | None
    #: (message id, request) of calls that wait for a person: turn ``turn_id`` waits (pausing.py)
    pauses: tuple[tuple[str, Pause], ...] = ()
    turn_id: str | None = None
    recheck: bool = False  # a retry after StorageOutcomeUnknownError (:func:`rechecked`)


class AppendToolResult(Op[MessageRecord], frozen=True, kw_only=True):
    conversation_id: str
    message_id: str
    result: ToolResult
    item: WorkingItem
    #: a retry after StorageOutcomeUnknownError (:func:`rechecked`)
    recheck: bool = False


class AnswerPause(Op[MessageRecord], frozen=True, kw_only=True):
    """A person's answer to a paused call, journaled; with ``resume`` (no other pause of the turn
    open) the turn is running again. Taken or not: decided before (``actors/pausing.py``)."""

    conversation_id: str
    message_id: str
    answer: PauseAnswer
    turn_id: str | None = None
    resume: bool = True
    recheck: bool = False  # a retry after StorageOutcomeUnknownError (:func:`rechecked`)


class FinishTurn(Op[list[MessageRecord]], frozen=True, kw_only=True):
    """The terminal record(s) of a turn: assistant answer and/or Interrupted and/or Error, then
    Touched; the turn row is removed in the same transaction."""

    conversation_id: str
    turn_id: str | None
    assistant: tuple[str, AssistantMessage] | None = None
    #: working-memory item stored with the assistant answer (None: nothing for the model to see)
    item: WorkingItem | None = None
    interrupted: bool = False
    error: tuple[str, Error] | None = None
    #: remove the working-memory items with order_idx >= this (a turn too big for the context
    #: window leaves nothing for the model to see; the journal keeps it)
    forget_from: int | None = None
    #: a retry after StorageOutcomeUnknownError (:func:`rechecked`)
    recheck: bool = False


def tokens_of(op: FinishTurn) -> int:
    """The model tokens a turn's answer counts against its conversation's user (docs/USERS.md):
    prompt + completion as the model reported them over the turn's rounds (0: none reported)."""
    if op.assistant is None or op.assistant[1].tokens is None:
        return 0
    tokens = op.assistant[1].tokens
    return tokens.prompt + tokens.completion


class Compact(Op[None], frozen=True, kw_only=True):
    """Replace working-memory items with order_idx < ``before_order_idx`` (the system prompt kept)
    by one summary item."""

    conversation_id: str
    before_order_idx: int
    summary: WorkingItem | None
    dropped: int
    #: a retry after StorageOutcomeUnknownError (:func:`rechecked`)
    recheck: bool = False


class RecoverTurns(Op[list[tuple[str, str]]], frozen=True, kw_only=True):
    """Close running turns with an Error record: at start-up every turn a dead process left
    running (``conversation_id`` None); in a PostgreSQL cluster, the running turn of one
    conversation claimed from a dead node (error "interrupted: node lost"). Queued turns (their
    message accepted, not started) stay: the conversation's next actor runs them, in order
    (``Reads.queued_turns``); turn rows of a conversation gone are removed. Returns the
    closed turns as (conversation id, turn id), in the order they came
    (``Storage.recover_turns`` ends their live streams)."""

    conversation_id: str | None = None
    message: str = "interrupted by restart"
    code: str = "restart"


class PurgeTemporary(Op[int], frozen=True, kw_only=True):
    """Start-up: temporary conversations do not survive a restart."""


class PutA2ATask(Op[int], frozen=True, kw_only=True):
    """A2A (docs/A2A.md): store one change of an A2A task: its whole record (``task``, the A2A Task
    JSON after the change) in ``a2a_task`` with seq = N, and a ``TaskUpdated`` event (outbox kind
    ``a2a``) at offset N carrying ``update`` (the A2A StreamResponse JSON of the change).

    Conditional: ``expect_seq`` is the row's seq the caller last read (None: the task must not
    exist yet); any other stored seq refuses the op with ConflictError, so two writers racing on
    one task (an answer and a cancel) cannot both win. Returns N."""

    task_id: str
    context_id: str
    #: the agentik conversation behind the task's context (None when there is none, e.g. tests'
    #: scripted executor); also the outbox row's conversation_id
    conversation_id: str | None
    state: str
    task: bytes
    update: bytes
    expect_seq: int | None
    #: an artifact chunk appended to the task (``update`` its artifactUpdate): only its event
    #: is stored (``task`` is not read); the row keeps the task as of its last whole change and
    #: that change's seq, which ``expect_seq`` names: a stream of chunks costs each its own
    #: bytes, not the whole task again (a reader folds the chunks after the row's seq back in)
    chunk: bool = False


class WebhookSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A webhook subscription as defined (docs/WEBHOOKS.md): where, which event types (the
    webhook names, ``webhooks.EVENT_TYPES``), the optional filters, its ``whsec_`` secret, and
    who made it: ``api`` (the admin routes), ``file`` (AGENTIK_WEBHOOKS) or ``a2a`` (an A2A push
    notification config, ``config`` its JSON as the client gave it)."""

    id: str
    url: str
    events: tuple[str, ...]
    agent: str | None = None
    conversation_id: str | None = None
    #: an A2A push config's task: only that task's changes
    task_id: str | None = None
    secret: str
    source: str = "api"
    config: bytes | None = None


class PutWebhook(Op[bool], frozen=True, kw_only=True):
    """A subscription stored (table ``webhook``), its progress starting after offset ``after``
    (events after it are its to deliver). True: it is new. An id already stored keeps its row
    and its progress; with ``replace`` its definition is updated (the settings file at start-up)."""

    spec: WebhookSpec
    after: int
    replace: bool = False


class DeleteWebhook(Op[bool], frozen=True, kw_only=True):
    """The subscription and its delivery log removed. True: it existed."""

    webhook_id: str


class WebhookAttempt(msgspec.Struct, frozen=True, kw_only=True):
    """One line of a subscription's delivery log: the event (its offset, its webhook type), the
    attempt's number and outcome (``webhooks.OUTCOMES``), the receiver's status and the error."""

    offset: int
    type: str
    attempt: int
    outcome: str
    status: int | None = None
    error: str | None = None


class WebhookProgress(Op[bool], frozen=True, kw_only=True):
    """A subscription's delivery state: every event up to ``after`` is done (delivered, given up
    or lost), the next one failed ``attempts`` times so far and is tried again ``retry_in``
    seconds after this write (the writer's clock, so it survives a restart); ``log`` added to
    its delivery log (the newest ``DELIVERY_LOG_KEEP`` kept). False: the subscription is gone
    (nothing stored)."""

    webhook_id: str
    after: int
    attempts: int = 0
    retry_in: float = 0.0
    log: tuple[WebhookAttempt, ...] = ()


#: lines of a subscription's delivery log kept (older ones go as new ones come)
DELIVERY_LOG_KEEP = 200


AnyOp = (
    CreateConversation
    | DeleteConversation
    | RenameConversation
    | AppendUserMessage
    | StartTurn
    | AppendToolCalls
    | AppendToolResult
    | AnswerPause
    | FinishTurn
    | Compact
    | RecoverTurns
    | PurgeTemporary
    | PutA2ATask
    | PutWebhook
    | DeleteWebhook
    | WebhookProgress
    | Regenerate
    | SwitchBranch
    | ResetMemory
    | ForkConversation
)


#: the ops with a rechecked form (:func:`rechecked`), by exact type
Recheckable = AppendToolCalls | AppendToolResult | AnswerPause | FinishTurn | StartTurn | Compact
RECHECKABLE: frozenset[type] = frozenset(Recheckable.__args__)


def journal_ids(op: Recheckable) -> tuple[str, ...]:
    """The ids of the journal records ``op`` stores (what its recheck looks for)."""
    if type(op) is AppendToolResult or type(op) is AnswerPause:
        return (op.message_id,)
    if type(op) is AppendToolCalls:
        return tuple(message_id for message_id, _ in (*op.calls, *op.pauses))
    if type(op) is FinishTurn:
        return tuple(made[0] for made in (op.assistant, op.error) if made is not None)
    return ()  # a StartTurn, a Compact: working memory only


def compacted(op: Compact, kept: list[WorkingItem]) -> bool:
    """Whether ``op`` is stored, from the working-memory items left with order_idx between the
    system prompt's and ``op.before_order_idx`` (``kept``, in order; two are enough): its
    summary alone, or none without one. Before it, that range held the ``op.dropped`` items it
    replaces (the actor, its only writer, planned it from them), so that tells unless it drops
    nothing (then it changes nothing there: planned as a first attempt, its event may be
    stored twice) or drops one item equal to its summary (then taken as stored: working memory
    is as it would leave it, only its event may be missing)."""
    return op.dropped > 0 and kept == ([] if op.summary is None else [op.summary])


def rechecked(op: OpT) -> OpT:
    """``op`` to retry after StorageOutcomeUnknownError (its first attempt may be stored).

    For a turn's writes (:data:`RECHECKABLE`), the copy with ``recheck`` set: its plan first
    reads whether the first attempt was stored (one of its journal message ids exists; for a
    FinishTurn also: its turn row is gone, the turn has its end; for a StartTurn: a working
    memory item of its conversation has the turn id as its source; for a Compact: what
    :func:`compacted` says) and then stores nothing and returns what is stored (the records,
    as a first success would have; None for a StartTurn, a Compact), else stores it as
    usual. Both engines plan it so (SQLite never has an unknown outcome, the check is the same).
    Only a retry pays that read: a first attempt reads what it always did.
    Any other op is returned as it is (a plain retry: one without an Idempotency-Key may store
    it twice)."""
    if type(op) in RECHECKABLE and not op.recheck:  # type: ignore[attr-defined]
        return msgspec.structs.replace(op, recheck=True)
    return op


#: the text fields of each op that come from a client (an id in a URL, a title, an A2A task's
#: ids): the store keeps them as text, which PostgreSQL's cannot hold with a NUL character
_CLIENT_TEXT: dict[type, tuple[str, ...]] = {
    cls: ("conversation_id",) for cls in (
        DeleteConversation, AppendUserMessage, StartTurn, AppendToolCalls, AppendToolResult,
        AnswerPause, FinishTurn, Compact, Regenerate, SwitchBranch, ResetMemory)
}
_CLIENT_TEXT.update({CreateConversation: ("title",), ForkConversation: ("title",),
                     RenameConversation: ("conversation_id", "title"),
                     RecoverTurns: ("conversation_id",),
                     PutA2ATask: ("task_id", "context_id", "conversation_id", "state"),
                     DeleteWebhook: ("webhook_id",), WebhookProgress: ("webhook_id",)})


def check_text(op: AnyOp) -> None:
    """The one rule on text both engines keep or look up: no NUL character (PostgreSQL cannot
    store one; SQLite is held to the same, so the engines answer alike). Checked for every write
    (``Storage.write``) and read (``reads.Reads``) before the engine sees it, so one bad request
    fails alone, never the batch it would share. Raises InvalidInputError."""
    for name in _CLIENT_TEXT.get(type(op), ()):
        value = getattr(op, name)
        if value is not None and "\x00" in value:
            raise InvalidInputError(f"{name} must not contain a NUL character")
    if type(op) is PutWebhook:
        spec = op.spec
        check_looked_up(spec.id, spec.url, spec.agent, spec.conversation_id, spec.task_id,
                        *spec.events)


def check_looked_up(*values: object) -> None:
    """:func:`check_text`'s rule for what a read looks up (an id, a filter). Raises
    InvalidInputError."""
    for value in values:
        if isinstance(value, str) and "\x00" in value:
            raise InvalidInputError("an id or filter must not contain a NUL character")
