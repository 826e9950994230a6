"""The code every backend shares: the tool-call assembler, the error boundary, the history walk."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
import trio

from agentik.errors import LlmConnectionError, LlmError, LlmResponseError, LlmTimeoutError
from agentik.llm.base import ToolCallAssembler, ToolCallDelta
from agentik.llm.boundary import ErrorTable, map_exceptions
from agentik.llm.history import render_history
from agentik.wire import (
    AssistantItem,
    Content,
    Image,
    SummaryItem,
    SystemItem,
    Text,
    ToolCallSpec,
    ToolItem,
    UserItem,
)

# --- ToolCallAssembler ---------------------------------------------------------------------------


def test_fragments_become_calls_in_index_order() -> None:
    calls = ToolCallAssembler()
    assert not calls
    for delta in [
        ToolCallDelta(index=1, id="b", name="now", arguments=""),
        ToolCallDelta(index=0, id="a", name="add", arguments='{"a"'),
        # repeated id and name (llama.cpp) are assigned, never appended
        ToolCallDelta(index=0, id="a", name="add", arguments=": 1}"),
    ]:
        calls.add(delta)
    assert calls
    assert calls.calls() == [
        ToolCallSpec(call_id="a", name="add", arguments='{"a": 1}'),
        ToolCallSpec(call_id="b", name="now", arguments="{}"),  # empty arguments are {}
    ]


def test_missing_ids_are_named_once_and_announced() -> None:
    calls = ToolCallAssembler()
    calls.add(ToolCallDelta(index=0, id="a", name="add"))
    calls.add(ToolCallDelta(index=1, name="now"))
    assert calls.name_missing_ids() == [ToolCallDelta(index=1, id="call_1")]
    assert calls.name_missing_ids() == []
    assert [c.call_id for c in calls.calls()] == ["a", "call_1"]


def test_a_call_never_named_gets_a_fresh_id_and_keeps_an_empty_name() -> None:
    calls = ToolCallAssembler()
    calls.add(ToolCallDelta(index=0, arguments="{}"))
    [call] = calls.calls()
    assert call.call_id.startswith("call_") and len(call.call_id) > len("call_")
    assert call.name == ""


# --- map_exceptions ------------------------------------------------------------------------------


class Base(Exception):
    pass


class Special(Base):
    pass


TABLE: ErrorTable = {
    Base: lambda exc: LlmConnectionError(f"base: {exc}"),
    Special: lambda exc: LlmTimeoutError(f"special: {exc}"),
}


def test_the_most_specific_entry_converts_and_chains() -> None:
    with pytest.raises(LlmTimeoutError, match="special: x") as info, map_exceptions(TABLE):
        raise Special("x")
    assert isinstance(info.value.__cause__, Special)
    with pytest.raises(LlmConnectionError, match="base: y"), map_exceptions(TABLE):
        raise Base("y")


def test_llm_errors_unmapped_errors_and_cancellation_pass_through() -> None:
    already = LlmResponseError("mine")
    with pytest.raises(LlmError) as info, map_exceptions({Exception: lambda e: LlmTimeoutError()}):
        raise already
    assert info.value is already
    with pytest.raises(KeyError), map_exceptions(TABLE):
        raise KeyError("k")
    with pytest.raises(GeneratorExit), map_exceptions({BaseException: TABLE[Base]}):  # type: ignore[dict-item]
        raise GeneratorExit


async def test_cancellation_passes_through() -> None:
    with trio.CancelScope() as scope, map_exceptions({Exception: TABLE[Base]}):
        scope.cancel()
        await trio.sleep_forever()
    assert scope.cancelled_caught


# --- render_history ------------------------------------------------------------------------------


class Recording:
    """A MessageFormat that records what the walk hands it."""

    def system(self, text: str) -> Any:
        return ("system", text)

    def user(self, parts: Sequence[Content]) -> Any:
        return ("user", list(parts))

    def assistant(self, text: str, calls: Sequence[ToolCallSpec]) -> Any:
        return ("assistant", text, list(calls))

    def tool(self, call_id: str, name: str, content: str) -> Any:
        return ("tool", call_id, name, content)


def test_one_walk_applies_the_shared_rules(caplog: pytest.LogCaptureFixture) -> None:
    image = Image(data="aGk=", mime="image/png")
    call = ToolCallSpec(call_id="c1", name="add", arguments="{}")
    history = [
        SystemItem(text="be brief"),
        SummaryItem(text="they met"),
        UserItem(content=[Text(body="look"), image]),
        AssistantItem(content=[Text(body="a "), image, Text(body="cat")], tool_calls=[call]),
        ToolItem(call_id="c1", name="add", content="3"),
    ]
    with caplog.at_level(logging.WARNING, logger="agentik.llm.history"):
        rendered = render_history(history, Recording(), supports_images=False)
    assert rendered == [
        ("system", "be brief"),
        ("system", "Summary of earlier conversation: they met"),
        ("user", [Text(body="look")]),
        ("assistant", "a cat", [call]),
        ("tool", "c1", "add", "3"),
    ]
    assert "dropped 1 image(s)" in caplog.text and "assistant message" in caplog.text
    with_images = render_history(history[2:3], Recording(), supports_images=True)
    assert with_images == [("user", [Text(body="look"), image])]
