"""Test doubles for the model, shipped for your tests (in the spirit of pydantic-ai's
``FunctionModel`` / ``TestModel``): real turns, real storage, real events, no model server.

``FunctionLlm(fn)`` is a :class:`~agentik.llm.base.LiteLlm` whose every round is computed by
``fn(messages, tools)``; ``ScriptedLlm(*replies)`` replays the given replies in order::

    from agentik.testing import FunctionLlm, ScriptedLlm
    from agentik.wire import ToolCallSpec

    def reply(messages, tools):
        return "you said " + messages[-1].content[0].body     # the user's message

    async with agentik.open_runtime(config, llm=FunctionLlm(reply)) as agent:
        ...

    llm = ScriptedLlm([ToolCallSpec(call_id="c1", name="add", arguments='{"a": 1, "b": 2}')],
                      "It is 3.")

``messages`` is the history as the backend sees it: the working-memory items
(:class:`~agentik.wire.SystemItem`, ``UserItem``, ``AssistantItem`` with its tool calls,
``ToolItem``, ``SummaryItem``) ending with this round's input: the user's message, or the tool
results of the previous round. ``tools`` are the :class:`~agentik.llm.base.ToolSpec` s the
session was opened with (a changed tool list means a new session, as with a real backend).

A reply (what ``fn`` returns, directly or as a coroutine, or a ``ScriptedLlm`` entry) is:

- a ``str``: the answer, streamed as one text delta;
- a list of deltas, each a ``str`` (text), a :class:`~agentik.wire.ToolCallSpec` (one whole tool
  call), or any delta of :mod:`agentik.llm.base` (``TextDelta``, ``ReasoningDelta``,
  ``ToolCallDelta``, ``UsageDelta``, ``FinishDelta``);
- an async iterator of such deltas, to pace a stream (await an event between two deltas).

An :class:`~agentik.errors.LlmError` raised by ``fn`` (or by the iterator) fails the turn with an
Error record, as a failing backend would; any other exception is a bug as far as the runtime can
tell (the supervisor records a crash). ``llm.requests`` lists every round's
``(messages, tools)``. Rounds keep the backend contract: the session appends the answer (text and
tool calls) to its own history once the round's stream is consumed, and ``add_tool_result``
appends a tool result.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Sequence
from typing import TypeAlias

from agentik.context import estimate_item
from agentik.errors import LlmResponseError
from agentik.llm.base import (
    FinishDelta,
    LiteConversation,
    LiteLlm,
    LlmDelta,
    TextDelta,
    ToolCallAssembler,
    ToolCallDelta,
    ToolSpec,
)
from agentik.wire import (
    AssistantItem,
    Content,
    Text,
    ToolCallSpec,
    ToolItem,
    UserItem,
    WorkingItem,
)

#: one piece of a reply: text, a whole tool call, or a backend delta
Delta: TypeAlias = str | ToolCallSpec | LlmDelta
#: what a round answers with
Reply: TypeAlias = str | Sequence[Delta] | AsyncIterable[Delta]
#: computes a round from (messages, tools)
ReplyFn: TypeAlias = Callable[[list[WorkingItem], list[ToolSpec]], Reply | Awaitable[Reply]]

__all__ = ["Delta", "FunctionLlm", "Reply", "ReplyFn", "ScriptedLlm"]


class FunctionLlm:
    """A LiteLlm whose rounds are computed by ``fn(messages, tools)`` (see the module docs)."""

    def __init__(
        self, fn: ReplyFn, *, supports_images: bool = True, context_window: int | None = None
    ) -> None:
        self.fn = fn
        self.supports_images = supports_images
        self.context_window = context_window
        #: token counts are estimates (agentik.context.estimate_item), as for a backend
        #: without a tokenizer
        self.exact_tokens = False
        self.max_output_tokens: int | None = None
        #: every round's (messages, tools), in order
        self.requests: list[tuple[list[WorkingItem], list[ToolSpec]]] = []
        #: sessions opened so far (a new one after a failure, a cancel or a changed tool list)
        self.sessions = 0

    async def open(self, history: Sequence[WorkingItem], tools: Sequence[ToolSpec]) -> LiteConversation:
        self.sessions += 1
        return _Session(self, list(history), list(tools))

    async def count_tokens(self, items: Sequence[WorkingItem]) -> list[int]:
        return [estimate_item(item) for item in items]

    async def aclose(self) -> None:
        return None


class ScriptedLlm(FunctionLlm):
    """Replays ``replies`` in order, one per round; a round with none left fails the turn with
    an LlmResponseError saying so."""

    def __init__(
        self, *replies: Reply, supports_images: bool = True, context_window: int | None = None
    ) -> None:
        self.replies: deque[Reply] = deque(replies)
        super().__init__(self._next, supports_images=supports_images,
                         context_window=context_window)

    def push(self, *replies: Reply) -> None:
        """Queue more replies."""
        self.replies.extend(replies)

    def _next(self, messages: list[WorkingItem], tools: list[ToolSpec]) -> Reply:
        if not self.replies:
            raise LlmResponseError(f"ScriptedLlm has no reply left for round {len(self.requests)}")
        return self.replies.popleft()


class _Session:
    def __init__(self, llm: FunctionLlm, history: list[WorkingItem], tools: list[ToolSpec]) -> None:
        self._llm = llm
        self._history = history
        self._tools = tools

    async def send_stream(
        self, content: Sequence[Content] | None, *, max_output_tokens: int | None = None
    ) -> AsyncGenerator[LlmDelta, None]:
        if content is not None:
            self._history.append(UserItem(content=list(content)))
        messages, tools = list(self._history), list(self._tools)
        self._llm.requests.append((messages, tools))
        reply = self._llm.fn(messages, tools)
        if inspect.isawaitable(reply):
            reply = await reply
        text: list[str] = []
        calls = ToolCallAssembler()
        async for delta in _deltas(reply):
            if isinstance(delta, TextDelta):
                text.append(delta.text)
            elif isinstance(delta, ToolCallDelta):
                calls.add(delta)
            yield delta
        # Only a round consumed to its end is the session's history (a real backend's session
        # is not reused after a cancel or an error either).
        said = "".join(text)
        self._history.append(AssistantItem(content=[Text(said)] if said else [],
                                           tool_calls=calls.calls()))

    def add_tool_result(self, call_id: str, name: str, result: str) -> None:
        self._history.append(ToolItem(call_id=call_id, name=name, content=result))

    async def close(self) -> None:
        return None


async def _deltas(reply: Reply) -> AsyncGenerator[LlmDelta, None]:
    """The reply as backend deltas, ending with a FinishDelta like a real stream. Whole tool
    calls (ToolCallSpec) get the indexes 0, 1, ... in their order."""
    index = 0
    finished = called = False
    async for item in _items(reply):
        delta: LlmDelta
        if isinstance(item, str):
            delta = TextDelta(item)
        elif isinstance(item, ToolCallSpec):
            delta = ToolCallDelta(index=index, id=item.call_id, name=item.name,
                                  arguments=item.arguments)
            index += 1
        else:
            delta = item
        called = called or isinstance(delta, ToolCallDelta)
        finished = finished or isinstance(delta, FinishDelta)
        yield delta
    if not finished:
        yield FinishDelta("tool_calls" if called else "stop")


async def _items(reply: Reply) -> AsyncGenerator[Delta, None]:
    if isinstance(reply, str):
        yield reply
    elif isinstance(reply, AsyncIterable):
        async for item in reply:
            yield item
    else:
        for item in reply:
            yield item


def _is_a_lite_llm(llm: FunctionLlm) -> LiteLlm:
    return llm  # mypy checks here that FunctionLlm keeps the backend protocol
