"""The OpenAI-compatible routes' pure decisions (agentik.openai_api.chat, .responses) without a
server: the seeded history read back as the caller sent it, the history check, and the numbering
of a response's events (any split of the text into deltas, any resume point)."""

from __future__ import annotations

import pytest

from agentik.openai_api import chat
from agentik.openai_api import responses as r
from agentik.wire import AssistantMessage, MessageRecord, Text, UserMessage

E = chat.Entry


def record(rid: str, message: object, seq: int) -> MessageRecord:
    return MessageRecord(id=rid, seq=seq, conversation_id="c", created_at=0.0,
                         message=message)  # type: ignore[arg-type]


def test_a_seeded_turn_reads_back_as_the_callers_history() -> None:
    history = [E("system", "Be brief."), E("user", "a"), E("assistant", "b")]
    content, context = chat.seed_content(history, [Text(body="c")], "chat.completions")
    assert isinstance(content[0], Text) and "Be brief." in content[0].body
    assert content[1:] == [Text(body="c")]
    records = [
        record("u1", UserMessage(content=content, context=context), 1),
        record("a1", AssistantMessage(content=[Text(body="d")], turn_id="u1"), 2),
        record("u2", UserMessage(content=[Text(body="failed turn")]), 3),  # never answered
    ]
    stored = chat.transcript(records)
    assert stored == [*history, E("user", "c"), E("assistant", "d")]
    sent = [E("user", "a"), E("assistant", "b"), E("user", "c"), E("assistant", "d")]
    assert chat.history_matches(sent, stored)
    assert chat.history_matches([], stored)  # only the new message
    assert chat.history_matches([E("system", "x")], stored)  # system messages are not history
    assert not chat.history_matches([E("system", "x")], stored, whole=True)
    assert not chat.history_matches([*sent[:-1], E("assistant", "edited")], stored)
    assert not chat.history_matches(sent[:2], stored)


def found(text: str) -> r.Found:
    return r.Found(rid="resp_c_t", conversation_id="c", turn_id="t", created_at=0.0,
                   params=r.Params(model="default"), input=[],
                   outcome=r.Outcome("completed", text))


@pytest.mark.parametrize("cuts", [[5], [1, 2, 3, 4, 5], [2, 5], [3]])
@pytest.mark.parametrize("after", [-1, 0, 3, 4, 5, 6, 8, 9, 12])
def test_events_are_numbered_by_the_text_whatever_the_split(cuts: list[int], after: int) -> None:
    """A stream that sent deltas ending at ``cuts`` and a reader resuming after ``after`` get,
    together, every event once in order, and deltas adding up to the text."""
    text = "hello"
    f = found(text)
    outcome = f.outcome
    live = [*r.head_events(f, -1)]
    start = 0
    for end in cuts:
        live.append(r.delta_event("t", text, start, end))
        start = end
    if start < len(text):  # the answer's rest, as the stream gives it before the tail
        live.append(r.delta_event("t", text, start, len(text)))
    live += r.tail_events(f, outcome, r.HEAD + len(text))
    numbers = [e.sequence_number for e in live]
    assert numbers == sorted(set(numbers))
    # a resumed reader after event `after` (one the live stream had, or past its end)
    before = [e for e in live if e.sequence_number <= after]
    resumed = [*r.head_events(f, after)]
    emitted = r.sent_chars(after)
    if len(text) > emitted:
        resumed.append(r.delta_event("t", text, emitted, len(text)))
    resumed += r.tail_events(f, outcome, max(after, r.HEAD + max(emitted, len(text))))
    if after not in numbers and after > r.HEAD and after < r.HEAD + len(text):
        return  # not an event this stream had: a reader never resumes there
    events = before + resumed
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers)), numbers
    assert "".join(e.delta or "" for e in events) == text
    assert events[-1].type == "response.completed"


def test_response_ids() -> None:
    assert r.parse_response_id(r.response_id("c1", "t1")) == ("c1", "t1")
    for bad in ("garbage", "resp_", "resp_x", "resp__t"):
        with pytest.raises(Exception, match="not found"):
            r.parse_response_id(bad)
