"""agentik.llm.openai_http: the chat-completions request sent through the SDK's HTTP client, and
the byte-level SSE line split."""

from __future__ import annotations

import json
from contextlib import aclosing

import openai
import pytest
import trio

from agentik.llm.base import TextDelta
from agentik.llm.openai import OpenAiLlm
from agentik.llm.openai_http import data_lines
from agentik.wire import Text
from tests.scripted_openai import Reply, open_scripted_openai


def test_data_lines_split_at_any_byte_and_any_line_end() -> None:
    body = b'data: {"a": 1}\r\n\r\n: comment\n\nevent: x\ndata:[DONE]\rdata: tail'
    for size in (1, 2, 3, 7, len(body)):
        rest, seen = b"", []
        for i in range(0, len(body), size):
            datas, rest = data_lines(rest, body[i : i + size])
            seen += datas
        assert seen == [b'{"a": 1}', b"[DONE]"], size
        assert rest == b"data: tail"  # no line end yet: kept for the next chunk
        assert data_lines(rest, b"\n") == ([b"tail"], b"")


@pytest.mark.parametrize("direct", [True, False])
async def test_the_request_carries_the_sdks_headers_and_the_sdks_url(direct: bool) -> None:
    """Sent directly (the SDK's plain API-key mode) or through the SDK's ``create`` (any other
    auth): the same request, the same answer."""
    async with open_scripted_openai() as server:
        server.push(Reply("hi there"))
        llm = OpenAiLlm(server.base_url, "sk-test", "m", max_retries=0)
        assert llm.chat.direct  # what agentik configures
        llm.chat.direct = direct
        try:
            conv = await llm.open([], [])
            with trio.fail_after(10):
                async with aclosing(conv.send_stream([Text(body="q")])) as stream:
                    text = "".join([d.text async for d in stream if isinstance(d, TextDelta)])
            sdk_headers = {k.lower(): v for k, v in llm.client.default_headers.items()
                           if isinstance(v, str) and not k.lower().startswith("x-stainless")}
        finally:
            await llm.aclose()
    assert text == "hi there"
    (headers,) = server.headers
    assert headers["authorization"] == "Bearer sk-test"
    assert headers["user-agent"].startswith("AsyncOpenAI/Python")
    assert headers["content-type"] == "application/json"
    for name, value in sdk_headers.items():
        assert headers.get(name) == value, name
    body = server.requests[0]
    assert body["messages"] == [{"role": "user", "content": "q"}]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_failures_are_the_sdks_own_exceptions() -> None:
    """What openai_errors maps: the SDK's status error subclass for an HTTP error, its
    connection error for a refused connection (checked end to end as LlmErrors elsewhere)."""
    from contextlib import AsyncExitStack

    from tests.scripted_openai import Fail

    async with open_scripted_openai() as server:
        server.push(Fail(401, "bad key"))
        llm = OpenAiLlm(server.base_url, None, "m", max_retries=0)
        try:
            assert llm.chat.direct
            async with AsyncExitStack() as stack:
                try:
                    await llm.chat.open(stack, {"model": "m", "messages": []})
                except openai.AuthenticationError as exc:
                    assert exc.status_code == 401 and "bad key" in str(exc)
                else:
                    raise AssertionError("no error")
        finally:
            await llm.aclose()
    closed = OpenAiLlm(server.base_url, None, "m", max_retries=0)  # the server is gone now
    try:
        async with AsyncExitStack() as stack:
            try:
                await closed.chat.open(stack, {"model": "m", "messages": []})
            except openai.APIConnectionError as exc:
                assert exc.__cause__ is not None
            else:
                raise AssertionError("no error")
    finally:
        await closed.aclose()


def test_an_sdk_with_other_internals_goes_through_create() -> None:
    """The direct path leans on the SDK client's private parts; an SDK release that renames one
    must fall back to ``create`` at construction, not fail on the first request."""
    from agentik.llm.openai_http import ChatEndpoint

    def renamed(self: openai.AsyncOpenAI) -> None:
        raise AttributeError("renamed in a later release")

    class LaterSdk(openai.AsyncOpenAI):
        _prepare_url = property(renamed)  # type: ignore[assignment]

    assert ChatEndpoint(openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:1/v1")).direct
    assert not ChatEndpoint(LaterSdk(api_key="k", base_url="http://127.0.0.1:1/v1")).direct


async def test_each_request_is_what_build_request_makes() -> None:
    """The request is copied from a template (issue 13): the same method, URL, headers in the
    same order (``Content-Length`` the body's own), timeouts and body as the HTTP client's
    ``build_request`` gives, for bodies of every length; once the client holds a cookie, it is
    sent, as ``build_request`` would."""
    llm = OpenAiLlm("http://127.0.0.1:1/v1", "sk-test", "m")
    try:
        chat, http = llm.chat, llm.client._client
        for content in (b"{}", b'{"model": "m"}', b"x" * 5000, b"{}"):
            ours = chat.request(content)
            theirs = http.build_request("POST", chat.url, content=content,
                                        headers=chat.headers(), timeout=llm.client.timeout)
            assert ours.method == theirs.method and ours.url == theirs.url
            assert ours.headers.raw == theirs.headers.raw
            assert ours.extensions == theirs.extensions
            assert ours.content == content
        http.cookies.set("route", "node-2", domain="127.0.0.1")
        assert chat.request(b"{}").headers["cookie"] == "route=node-2"
    finally:
        await llm.aclose()


async def test_a_compressed_stream_is_decoded() -> None:
    """An identity stream is read raw; a server (or a proxy) that gzips the stream is still
    decoded."""
    import gzip

    import httpx2

    events = [
        {"choices": [{"index": 0, "delta": {"content": "zipped"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=gzip.compress(sse.encode()), headers={
            "content-type": "text/event-stream", "content-encoding": "gzip"})

    llm = OpenAiLlm("http://127.0.0.1:1/v1", None, "m", max_retries=0)
    try:
        llm.client._client._transport = httpx2.MockTransport(handler)
        conv = await llm.open([], [])
        async with aclosing(conv.send_stream([Text(body="q")])) as stream:
            text = "".join([d.text async for d in stream if isinstance(d, TextDelta)])
    finally:
        await llm.aclose()
    assert text == "zipped"
