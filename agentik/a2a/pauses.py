"""A task whose turn waits for a person (docs/A2A.md, "A task that asks"), the pure part: what its
INPUT_REQUIRED status message says (a question's text; for an approval a text naming the tool
and its arguments and a data part ``{"call_id", "tool", "arguments"}``), which pause a follow-up
message answers (the status message's metadata names it, so it is read back from the stored
task, also after a restart), and what answer a follow-up's parts make (a question's text or
data; an approval's ``{"approve", "reason"}`` data part, or a plain yes / no).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from agentik.a2a.types import Message, Part, Task
from agentik.wire import ApprovalAnswer, ApprovalRequest, InputAnswer, Pause, PauseAnswer

#: the first word of a plain answer to an approval (lower case)
YES = frozenset({"yes", "y", "ok", "okay", "approve", "approved", "allow", "sure", "go"})
NO = frozenset({"no", "n", "deny", "denied", "refuse", "refused", "reject", "stop", "don't"})


@dataclass(frozen=True)
class Waiting:
    """The pause a task's INPUT_REQUIRED status message asks about."""

    call_id: str
    turn_id: str
    #: the request's journal seq: the turn's pauses are read from there on
    seq: int


def arguments_value(arguments: str) -> Any:
    """A call's arguments as JSON (the text as is when it is not JSON)."""
    try:
        return msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError:
        return arguments


def ask_parts(request: Pause) -> list[Part]:
    """The INPUT_REQUIRED status message's parts for ``request``."""
    if isinstance(request, ApprovalRequest):
        text = (f"Approve calling the tool {request.tool} with the arguments "
                f"{request.arguments or '{}'}? Answer yes or no (a reason may follow).")
        return [Part(text=text), Part(data={"call_id": request.call_id, "tool": request.tool,
                                            "arguments": arguments_value(request.arguments)})]
    data: dict[str, Any] = {"call_id": request.call_id, "question": request.question}
    if request.choices:
        data["choices"] = request.choices
    if request.schema is not None:
        data["schema"] = request.schema
    return [Part(text=request.question), Part(data=data)]


def ask_metadata(request: Pause, seq: int) -> dict[str, Any]:
    """The status message's metadata: which pause it asks about (:func:`waiting_of`)."""
    return {"agentik": {"pause": {"callId": request.call_id, "turnId": request.turn_id,
                                  "seq": seq}}}


def waiting_of(task: Task) -> Waiting | None:
    """The pause ``task`` asks about: the one its last agent message (the INPUT_REQUIRED status
    message, moved to the history by a follow-up) names."""
    for message in (task.status.message, *reversed(task.history)):
        if message is None or message.role != "ROLE_AGENT":
            continue
        pause = ((message.metadata or {}).get("agentik") or {}).get("pause")
        if not isinstance(pause, dict):
            return None
        call_id, turn_id, seq = pause.get("callId"), pause.get("turnId"), pause.get("seq")
        if isinstance(call_id, str) and isinstance(turn_id, str) and isinstance(seq, int):
            return Waiting(call_id=call_id, turn_id=turn_id, seq=seq)
        return None
    return None


def _data(parts: Sequence[Part]) -> dict[str, Any] | None:
    for part in parts:
        if isinstance(part.data, dict):
            return part.data
    return None


def _text(parts: Sequence[Part]) -> str:
    return "\n".join(part.text for part in parts if part.text is not None).strip()


def yes_or_no(text: str) -> tuple[bool, str | None] | None:
    """A plain answer to an approval: (approve, the reason after the first word, if any); None
    when it is neither a yes nor a no."""
    word, _, rest = text.strip().partition(" ")
    word = word.strip(".,:;!-").lower()
    reason = rest.strip(" .,:;-") or None
    if word in YES:
        return True, reason
    if word in NO:
        return False, reason
    return None


def answer_of(request: Pause, message: Message) -> PauseAnswer | str:
    """The answer a follow-up ``message`` gives ``request``; a str says why it gives none."""
    data, text = _data(message.parts), _text(message.parts)
    if isinstance(request, ApprovalRequest):
        if data is not None and isinstance(data.get("approve"), bool):
            reason = data.get("reason")
            return ApprovalAnswer(call_id=request.call_id, approve=data["approve"],
                                  reason=reason if isinstance(reason, str) else None)
        said = yes_or_no(text)
        if said is None:
            return (f"the call {request.call_id} of {request.tool} waits for an approval: answer "
                    'yes or no, or a data part {"approve": true|false, "reason": "..."}')
        return ApprovalAnswer(call_id=request.call_id, approve=said[0], reason=said[1])
    if request.schema is not None and data is not None:
        return InputAnswer(call_id=request.call_id,
                           data={k: v for k, v in data.items() if k != "call_id"})
    if text:
        return InputAnswer(call_id=request.call_id, text=text)
    if data is not None:
        return InputAnswer(call_id=request.call_id, text=json.dumps(data, ensure_ascii=False))
    return f"the question {request.call_id} waits for an answer: send it as a text part"
