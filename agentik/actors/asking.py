"""A person in the loop, the pure rules (docs/PROTOCOL.md, "A person in the loop"): which calls
of a round wait for a person (an approval, the built-in ``ask_user`` question), the request each
is stored with, what a call's answer makes of it, and unique call ids (an answer route names a
call by its id). ``turn.py`` asks these; the waiting itself is ``pausing.py``'s."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import assert_never

import msgspec

from agentik.ids import new_id
from agentik.llm.base import ToolSpec
from agentik.profiles import ASK_USER
from agentik.tools.base import Elicited
from agentik.wire import (
    ApprovalAnswer,
    ApprovalRequest,
    AssistantItem,
    InputAnswer,
    InputRequest,
    MessageContext,
    Pause,
    Text,
    ToolCallSpec,
    ToolResult,
    UserItem,
    WorkingItem,
    encode,
)


@dataclass(frozen=True)
class PausePolicy:
    """Which calls of a round wait for a person: those ``needs_approval`` names (by the tool's
    full name), and ``ask_user`` calls when the agent has that tool; ``deadline``: Unix seconds
    when an unanswered pause is denied (None: never)."""

    needs_approval: Callable[[str], bool]
    ask_user: bool = False
    deadline: float | None = None
    #: the turn's client-side tools (``MessageContext.tools``): their calls wait for a result
    client_tools: frozenset[str] = frozenset()


ASK_USER_SPEC = ToolSpec(
    name=ASK_USER,
    description="Ask the user a question and wait for their answer (use it when you need "
                "information or a decision only they can give). Returns their answer.",
    parameters={"type": "object", "properties": {
        "question": {"type": "string", "description": "the question, as the user will read it"},
        "choices": {"type": "array", "items": {"type": "string"},
                    "description": "answers to offer, if any (the user may still write another)"},
    }, "required": ["question"]},
)
#: a denied call's result when the deadline passed; the start of one a person refused
NO_ANSWER = "no answer came in time"
REFUSED = "the user refused this call"


def client_specs(context: MessageContext | None, own: Collection[str]) -> tuple[ToolSpec, ...]:
    """The turn's client-side tools as the model sees them; one named like a tool of the agent's
    own (or ``ask_user``) is left out: the agent's runs (the front doors refuse such a name)."""
    if context is None or not context.tools:
        return ()
    return tuple(ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
                 for t in context.tools if t.name not in own and t.name != ASK_USER)


def unique_calls(calls: list[ToolCallSpec], seen: set[str]) -> tuple[list[ToolCallSpec], bool]:
    """``calls`` with every id new to ``seen`` (which gets them): an empty or reused id is
    replaced by agentik's own. Whether any was."""
    out: list[ToolCallSpec] = []
    renamed = False
    for call in calls:
        if not call.call_id or call.call_id in seen:
            call = ToolCallSpec(call_id=f"call_{new_id()}", name=call.name,
                                arguments=call.arguments)
            renamed = True
        seen.add(call.call_id)
        out.append(call)
    return out, renamed


def pauses_for(turn_id: str, calls: list[ToolCallSpec], policy: PausePolicy
               ) -> tuple[tuple[str, Pause], ...]:
    """The pause each call of the round waits on (journal id, request), in call order. An
    ``ask_user`` call whose arguments are not a question gets none: it fails as a tool."""
    out: list[tuple[str, Pause]] = []
    for call in calls:
        pause: Pause | None = None
        if call.name in policy.client_tools:
            pause = InputRequest(call_id=call.call_id, tool=call.name, deadline=policy.deadline,
                                 question=f"the result of the client-side tool {call.name} "
                                          f"called with {call.arguments or '{}'}",
                                 turn_id=turn_id)
        elif call.name == ASK_USER and policy.ask_user:
            asked = question_of(call.arguments)
            if asked is not None:
                pause = InputRequest(call_id=call.call_id, question=asked[0], choices=asked[1],
                                     deadline=policy.deadline, turn_id=turn_id)
        elif policy.needs_approval(call.name):
            pause = ApprovalRequest(call_id=call.call_id, tool=call.name, arguments=call.arguments,
                                    deadline=policy.deadline, turn_id=turn_id)
        if pause is not None:
            out.append((new_id(), pause))
    return tuple(out)


def question_of(arguments: str) -> tuple[str, list[str] | None] | None:
    """An ``ask_user`` call's (question, choices), or None when its arguments hold none."""
    try:
        args = msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError:
        return None
    if not isinstance(args, dict):
        return None
    question, choices = args.get("question"), args.get("choices")
    if not isinstance(question, str) or not question.strip():
        return None
    if not (isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices)):
        choices = None
    return question, choices


def answer_outcome(answer: ApprovalAnswer | InputAnswer) -> tuple[str, bool] | None:
    """What a paused call's answer makes of its result, (content, is error): None when it was
    approved (the tool runs); a refusal (with the person's reason verbatim, or that no answer
    came in time); the answer to a question (its text, or its data as JSON)."""
    match answer:
        case ApprovalAnswer(approve=True):
            return None
        case ApprovalAnswer(timed_out=True):
            return f"the call was denied: {NO_ANSWER}", True
        case ApprovalAnswer(reason=reason):
            return (f"{REFUSED}: {reason}" if reason else REFUSED), True
        case InputAnswer(timed_out=True):
            return f"the user did not answer: {NO_ANSWER}", True
        case InputAnswer(text=text, data=data):
            return (text or "") if data is None else encode(data).decode(), False
        case _:
            assert_never(answer)


def elicited(answer: InputAnswer) -> Elicited:
    """What a tool server's question (an MCP elicitation) is answered: a structured answer
    accepts it, a text one declines it, none in time (or the turn ended) cancels it."""
    if answer.timed_out:
        return Elicited(action="cancel")
    if answer.data is not None:
        return Elicited(action="accept", content=answer.data)
    return Elicited(action="decline")


def paused_result(turn_id: str, call: ToolCallSpec,
                  answer: ApprovalAnswer | InputAnswer) -> ToolResult | None:
    """A paused call's result from its answer (:func:`answer_outcome`); None: approved, the
    tool runs."""
    outcome = answer_outcome(answer)
    if outcome is None:
        return None
    content, is_error = outcome
    return ToolResult(call_id=call.call_id, name=call.name, content=content, is_error=is_error,
                      turn_id=turn_id)


def round_texts(memory: Sequence[WorkingItem]) -> list[str]:
    """The text of a waiting turn's rounds so far (what the user saw: its answer keeps it), from
    working memory: the assistant items after the last user item, the turn's own."""
    start = max((i for i, item in enumerate(memory) if isinstance(item, UserItem)), default=-1)
    return [text for item in memory[start + 1:] if isinstance(item, AssistantItem)
            and (text := "".join(c.body for c in item.content if isinstance(c, Text)))]
