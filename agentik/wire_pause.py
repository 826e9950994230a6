"""The journal's records of a paused turn (docs/PROTOCOL.md, "A person in the loop"): a tool call
that waits for a person's approval, a question to the person, and their answers. Members of
:data:`agentik.wire.Message` (defined here to keep :mod:`agentik.wire` within its size; import
them from there). Each is stored in the journal with its event (``approval_requested``,
``approval_given``, ``input_requested``, ``input_given``), so a pause is as durable as a message:
it survives restarts and is read back when its conversation is loaded."""

from __future__ import annotations

from typing import Any

from agentik.wire_base import Tagged, Wire


class ApprovalRequest(Tagged, frozen=True, kw_only=True):
    """A tool call waiting for a person's yes or no before it runs."""

    #: unique within the conversation: the model's id, or agentik's own where a model reuses one
    call_id: str
    #: the tool's full name as the model sees it (``server__tool``)
    tool: str
    #: the call's arguments: JSON text exactly as the model produced it
    arguments: str
    #: Unix seconds after which the call is denied ("no answer came in time"); None: no limit
    deadline: float | None = None
    turn_id: str | None = None


class ApprovalAnswer(Tagged, frozen=True, kw_only=True):
    call_id: str
    approve: bool
    #: the person's reason, told to the model verbatim when they refuse
    reason: str | None = None
    #: no answer came before the deadline: agentik's denial, not a person's
    timed_out: bool = False
    turn_id: str | None = None


class ClientTool(Wire, frozen=True, kw_only=True):
    """A tool the sender runs itself (OpenAI's client-side tools), offered to the model for the
    turn of the message whose context names it: a call of it pauses the turn (an
    ``InputRequest`` with ``tool`` set) until its result is answered."""

    name: str
    description: str = ""
    #: the JSON schema of its arguments
    parameters: dict[str, Any] = {}


class InputRequest(Tagged, frozen=True, kw_only=True):
    """A question to the person (the built-in ``ask_user`` tool, an MCP elicitation), or the
    result of a call of a client-side tool (``tool``)."""

    call_id: str
    question: str
    #: the answers offered, if any (the person may still write another)
    choices: list[str] | None = None
    #: the JSON schema of a structured answer (an MCP elicitation's), None: a text answer
    schema: Any = None
    deadline: float | None = None
    turn_id: str | None = None
    #: a client-side tool's name (``ClientTool``): the answer is that call's result
    tool: str | None = None


class InputAnswer(Tagged, frozen=True, kw_only=True):
    call_id: str
    text: str | None = None
    #: a structured answer (an elicitation's schema)
    data: dict[str, Any] | None = None
    timed_out: bool = False
    turn_id: str | None = None


#: what a turn waits on, and its answer
Pause = ApprovalRequest | InputRequest
PauseAnswer = ApprovalAnswer | InputAnswer
