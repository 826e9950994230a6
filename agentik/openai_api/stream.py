"""A followed turn as a Chat Completions answer: one ``chat.completion`` object, or its stream of
``chat.completion.chunk`` events (SSE ``data:`` lines, ending with ``data: [DONE]``).

The stream: a first chunk with the role, one chunk per piece of live text, the answer's rest
(what the live text did not carry), a last chunk with ``finish_reason``, and with
``stream_options.include_usage`` a chunk with no choices and the turn's usage. The agent's tool
calls run server-side and are not shown; a turn that waits for the results of the caller's own
tools (``tools``) ends its answer with their calls (``tool_calls``, ``finish_reason:
"tool_calls"``), each id naming the conversation unless the caller names it
(:func:`call_id_out`). A turn that fails or is interrupted after the stream started ends it with
a ``data: {"error": {...}}`` event, which the openai SDK raises as an APIError; before the
stream starts it is an HTTP error answer.
"""

from __future__ import annotations

import time

import trio
from quart import Response

from agentik.openai_api.follow import (
    ENDINGS,
    Cancelled,
    ClientCalls,
    Failed,
    Finished,
    PersonAsks,
    TextDelta,
    TurnEvent,
)
from agentik.openai_api.service import OpenAiMount, TurnRun
from agentik.openai_api.types import (
    AssistantOut,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    Delta,
    ErrorAnswer,
    ErrorObject,
    FunctionCall,
    ToolCallDelta,
    ToolCallOut,
    Usage,
    encode,
)
from agentik.sse import SSE_TYPE, PumpBody, frame
from agentik.wire import ApprovalRequest, Pause, TurnTokens

DONE = b"data: [DONE]\n\n"


def usage_of(tokens: TurnTokens | None) -> Usage:
    prompt = tokens.prompt if tokens else 0
    completion = tokens.completion if tokens else 0
    return Usage(prompt_tokens=prompt, completion_tokens=completion,
                 total_tokens=prompt + completion)


def finish_reason(end: Finished) -> str:
    """``length`` when the answer was cut at the output budget; else ``stop`` (tool rounds ran
    server-side, so the caller's answer is complete)."""
    return "length" if end.finish_reason == "length" else "stop"


def ending_error(end: Failed | Cancelled) -> tuple[int, ErrorObject]:
    """The status and error of a turn that did not answer."""
    if isinstance(end, Cancelled):
        return 409, ErrorObject(message="the turn was interrupted before it answered",
                                type="invalid_request_error", code="interrupted")
    return 502, ErrorObject(message=f"the agent's turn failed: {end.message}",
                            type="server_error", code=end.code)


#: between the id of a call and the conversation it belongs to, in the ids given to the caller
CALL_SEP = "@"


def call_id_out(call_id: str, conversation_id: str | None) -> str:
    """The id a client-side call is given to the caller: with its conversation when the caller
    did not name one (a temporary conversation), so the request with its result finds it."""
    return call_id if conversation_id is None else f"{call_id}{CALL_SEP}{conversation_id}"


def call_id_in(given: str) -> tuple[str, str | None]:
    """A tool message's ``tool_call_id`` as (the call's id, the conversation it names or None)."""
    call_id, sep, conversation_id = given.rpartition(CALL_SEP)
    return (call_id, conversation_id) if sep and call_id and conversation_id else (given, None)


def ask_text(request: Pause) -> str:
    """What the answer says when its turn waits for a person (``PersonAsks``): the question, or
    the approval asked; the caller's next message answers it (docs/OPENAI.md)."""
    if isinstance(request, ApprovalRequest):
        return (f"The tool {request.tool} is about to run with {request.arguments or '{}'}. "
                "Reply yes to approve it, or no to refuse it (a reason may follow).")
    choices = f" ({' / '.join(request.choices)})" if request.choices else ""
    return request.question + choices


async def ending_of(run: TurnRun) -> Finished | Failed | Cancelled | ClientCalls | PersonAsks:
    """Read a run's events to its ending (the live text is not needed: the answer is whole)."""
    async with run.events:
        async for event in run.events:
            if isinstance(event, ENDINGS):
                return event
    return Failed(message="the turn's events ended without an ending", code="internal")


def completion(run: TurnRun, model: str, end: Finished | ClientCalls | PersonAsks
               ) -> ChatCompletion:
    if isinstance(end, PersonAsks):
        choice = Choice(message=AssistantOut(content=ask_text(end.request)), finish_reason="stop")
        return ChatCompletion(id=f"chatcmpl-{run.turn_id}", created=int(time.time()),
                              model=model, choices=[choice], usage=usage_of(None))
    if isinstance(end, ClientCalls):
        calls = [ToolCallOut(id=call_id_out(c.call_id, run.ids_for),
                             function=FunctionCall(name=c.name, arguments=c.arguments))
                 for c in end.calls]
        choice = Choice(message=AssistantOut(content=None, tool_calls=calls),
                        finish_reason="tool_calls")
        return ChatCompletion(id=f"chatcmpl-{run.turn_id}", created=int(time.time()),
                              model=model, choices=[choice], usage=usage_of(None))
    return ChatCompletion(
        id=f"chatcmpl-{run.turn_id}", created=int(time.time()), model=model,
        choices=[Choice(message=AssistantOut(content=end.answer),
                        finish_reason=finish_reason(end))],
        usage=usage_of(end.tokens),
    )


def chat_stream(mount: OpenAiMount, run: TurnRun, model: str, include_usage: bool,
                headers: dict[str, str]) -> Response:
    body = _ChunkBody(mount, run, model, include_usage)
    response = Response(body, status=200, content_type=SSE_TYPE,
                        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", **headers})
    response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut the stream
    return response


class _ChunkBody(PumpBody):
    """The chunks, written by a pump in the body's nursery (:class:`agentik.sse.PumpBody`); a
    client gone cancels the pump, and closing the run's events stops its follower."""

    def __init__(self, mount: OpenAiMount, run: TurnRun, model: str, include_usage: bool) -> None:
        super().__init__(self._pump, mount.heartbeat, opened=b"")
        self._mount = mount
        self._run = run
        self._model = model
        self._usage = include_usage
        self._created = int(time.time())

    def _chunk(self, delta: Delta, finish: str | None = None) -> bytes:
        return frame(encode(ChatCompletionChunk(
            id=f"chatcmpl-{self._run.turn_id}", created=self._created, model=self._model,
            choices=[ChunkChoice(delta=delta, finish_reason=finish)])))

    async def _pump(self, send: trio.MemorySendChannel[bytes],
                    *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with send, self._run.events:
            await send.send(self._chunk(Delta(role="assistant", content="")))
            async for event in self._run.events:
                for data in self._frames(event):
                    await send.send(data)
                if isinstance(event, ENDINGS):
                    break
            else:
                _, error = ending_error(Failed(message="the turn's events ended", code="internal"))
                await send.send(frame(encode(ErrorAnswer(error=error))))
            await send.send(DONE)

    def _frames(self, event: TurnEvent) -> list[bytes]:
        if isinstance(event, TextDelta):
            return [self._chunk(Delta(content=event.text))]
        if isinstance(event, PersonAsks):
            return [self._chunk(Delta(content=ask_text(event.request))),
                    self._chunk(Delta(), "stop")]
        if isinstance(event, Finished):
            out = [self._chunk(Delta(content=event.rest))] if event.rest else []
            out.append(self._chunk(Delta(), finish_reason(event)))
            if self._usage:
                out.append(frame(encode(ChatCompletionChunk(
                    id=f"chatcmpl-{self._run.turn_id}", created=self._created,
                    model=self._model, choices=[], usage=usage_of(event.tokens)))))
            return out
        if isinstance(event, Failed | Cancelled):
            _, error = ending_error(event)
            return [frame(encode(ErrorAnswer(error=error)))]
        if isinstance(event, ClientCalls):
            calls = [ToolCallDelta(index=i, id=call_id_out(c.call_id, self._run.ids_for),
                                   function=FunctionCall(name=c.name, arguments=c.arguments))
                     for i, c in enumerate(event.calls)]
            out = [self._chunk(Delta(tool_calls=calls)), self._chunk(Delta(), "tool_calls")]
            if self._usage:
                out.append(frame(encode(ChatCompletionChunk(
                    id=f"chatcmpl-{self._run.turn_id}", created=self._created,
                    model=self._model, choices=[], usage=usage_of(None)))))
            return out
        return []  # a tool call: run server-side, not shown

    def opened(self) -> None:
        self._mount.stream_count(+1)

    def closed(self) -> None:
        self._run.scope.cancel()
        self._mount.stream_count(-1)
