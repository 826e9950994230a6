"""Issue 11 #4: AGENTIK_LLM_TIMEOUT bounds the whole wait for the model's response, retries
included, and a retry is made only when it can still finish in time.

The policy (:func:`agentik.llm.boundary.retry_within`) runs on trio's MockClock with scripted
attempts (no sockets: the clock jumps whenever every task waits); what is retried
(:func:`agentik.llm.openai.retry_delay`) is checked on the SDK's own exceptions; and the openai
backend retries a fast failure over real sockets (a 500, a connection closed without an answer)
and succeeds. The hung endpoint over real sockets is tests/test_llm_cut.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import aclosing
from urllib.parse import urlsplit

import httpx2
import openai
import pytest
import trio
import trio.testing

from agentik.errors import LlmResponseError, LlmTimeoutError
from agentik.llm.base import TextDelta
from agentik.llm.boundary import retry_within
from agentik.llm.openai import OpenAiLlm
from agentik.llm.openai_errors import retry_delay
from agentik.wire import Text
from tests.scripted_openai import Fail, Reply, open_scripted_openai
from tests.tcp_proxy import open_tcp_proxy


class Flaky(Exception):
    """A retryable failure of a scripted attempt."""


class Fatal(Exception):
    """A failure not worth retrying (a 400, a 401)."""


def scripted(*steps: tuple[float, str]) -> tuple[Callable[[], Awaitable[str]], list[float]]:
    """An attempt that plays ``(seconds, outcome)`` steps in order: after ``seconds`` it returns
    "ok", raises Flaky ("flaky") or Fatal ("fatal"), or never ends ("hang"). Returns it and the
    list of the times each attempt started."""
    queue = list(steps)
    started: list[float] = []

    async def attempt() -> str:
        started.append(trio.current_time())
        seconds, outcome = queue.pop(0)
        if outcome == "hang":
            await trio.sleep_forever()
        await trio.sleep(seconds)
        if outcome == "flaky":
            raise Flaky(f"failed after {seconds} s")
        if outcome == "fatal":
            raise Fatal("not retryable")
        return outcome

    return attempt, started


def delay(exc: Exception, retries: int) -> float | None:
    return 0.5 if isinstance(exc, Flaky) else None


async def run(attempt: Callable[[], Awaitable[str]], max_retries: int = 2) -> str:
    """Within 120 s (virtual: the MockClock jumps)."""
    with trio.fail_after(1000):  # a broken deadline fails here instead of hanging
        return await retry_within(
            attempt, deadline=trio.current_time() + 120.0, max_retries=max_retries,
            retry_delay=delay,
            timed_out=lambda n: LlmTimeoutError(f"timed out after {n} attempts"),
        )


async def test_a_hung_attempt_ends_at_the_deadline(autojump_clock: trio.testing.MockClock) -> None:
    attempt, started = scripted((0, "hang"))
    with pytest.raises(LlmTimeoutError, match="after 1 attempts"):
        await run(attempt)
    assert trio.current_time() == 120.0  # the timeout, not (retries + 1) x the timeout
    assert started == [0.0]


async def test_fast_failures_are_retried(autojump_clock: trio.testing.MockClock) -> None:
    attempt, started = scripted((0.01, "flaky"), (0.01, "flaky"), (0.01, "ok"))
    assert await run(attempt) == "ok"
    assert started == pytest.approx([0.0, 0.51, 1.02])


async def test_no_retry_that_cannot_finish_in_time(autojump_clock: trio.testing.MockClock) -> None:
    """A failure after 70 of 120 s: another 70 s attempt would be cut by the deadline, so the
    turn fails with that failure at once instead of a timeout 50 s later."""
    attempt, started = scripted((70, "flaky"), (0, "ok"))
    with pytest.raises(Flaky, match="after 70"):
        await run(attempt)
    assert trio.current_time() == 70.0
    assert started == [0.0]


async def test_a_slow_failure_that_still_fits_is_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempt, started = scripted((30, "flaky"), (1, "ok"))
    assert await run(attempt) == "ok"
    assert started == [0.0, 30.5]


async def test_a_retry_that_hangs_ends_at_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempt, started = scripted((0.01, "flaky"), (0, "hang"))
    with pytest.raises(LlmTimeoutError, match="after 2 attempts"):
        await run(attempt)
    assert trio.current_time() == 120.0
    assert len(started) == 2


async def test_not_retryable_and_exhausted_retries_fail_with_their_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempt, started = scripted((0.01, "fatal"))
    with pytest.raises(Fatal):
        await run(attempt)
    assert len(started) == 1
    attempt, started = scripted((0.01, "flaky"), (0.01, "flaky"), (0.01, "flaky"), (0, "ok"))
    with pytest.raises(Flaky):
        await run(attempt, max_retries=2)
    assert len(started) == 3


# --- what is retried -----------------------------------------------------------------------------

REQUEST = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")


def status_error(status: int, **headers: str) -> openai.APIStatusError:
    response = httpx2.Response(status, headers=headers, request=REQUEST)
    return openai.APIStatusError("error", response=response, body=None)


def test_retry_delay_follows_what_the_sdk_retries() -> None:
    for status in (408, 409, 429, 500, 502, 503):
        wait = retry_delay(status_error(status), 0)
        assert wait is not None and 0.375 <= wait <= 0.5, status
    for status in (400, 401, 403, 404, 413, 422):
        assert retry_delay(status_error(status), 0) is None, status
    assert retry_delay(status_error(500, **{"x-should-retry": "false"}), 0) is None
    assert retry_delay(status_error(400, **{"x-should-retry": "true"}), 0) is not None
    assert retry_delay(status_error(429, **{"retry-after": "2"}), 0) == 2.0
    assert retry_delay(status_error(429, **{"retry-after-ms": "250"}), 0) == 0.25
    backoff = retry_delay(status_error(429, **{"retry-after": "3600"}), 3)  # too long: backoff
    assert backoff is not None and 3.0 <= backoff <= 4.0
    assert retry_delay(openai.APIConnectionError(request=REQUEST), 10) == pytest.approx(8.0, rel=0.25)
    assert retry_delay(ValueError("malformed"), 0) is None


# --- over real sockets ---------------------------------------------------------------------------


async def _ask(llm: OpenAiLlm) -> str:
    conv = await llm.open([], [])
    async with aclosing(conv.send_stream([Text(body="hi")])) as stream:
        return "".join([delta.text async for delta in stream if isinstance(delta, TextDelta)])


async def test_a_500_is_retried_and_the_turn_succeeds() -> None:
    async with open_scripted_openai() as server:
        server.push(Fail(500, "the model fell over"), Reply("fine"))
        llm = OpenAiLlm(server.base_url, None, "m", timeout=3.0, max_retries=2)
        try:
            with trio.fail_after(6):
                assert await _ask(llm) == "fine"
        finally:
            await llm.aclose()
    assert len(server.requests) == 2


async def test_the_retries_are_ours_only() -> None:
    """AGENTIK_LLM_MAX_RETRIES=1 is two requests in all (the SDK retries nothing itself: its
    retries would multiply ours and each get the whole timeout again)."""
    async with open_scripted_openai() as server:
        server.push(Fail(500, "first"), Fail(503, "second"), Reply("too late"))
        llm = OpenAiLlm(server.base_url, None, "m", timeout=3.0, max_retries=1)
        try:
            with trio.fail_after(6), pytest.raises(LlmResponseError, match="503"):
                await _ask(llm)
        finally:
            await llm.aclose()
    assert len(server.requests) == 2


async def test_a_connection_closed_without_an_answer_is_retried() -> None:
    async with open_scripted_openai() as server:
        server.push(Reply("fine"))
        target = urlsplit(server.base_url)
        assert target.hostname is not None and target.port is not None
        async with open_tcp_proxy(target.hostname, target.port) as proxy, trio.open_nursery() as n:
            proxy.refuse = True  # the first connection is accepted, then closed unanswered

            async def heal() -> None:
                await proxy.wait_connections(1)
                proxy.refuse = False

            n.start_soon(heal)
            llm = OpenAiLlm(proxy.url + "/v1", None, "m", timeout=3.0, max_retries=2)
            try:
                with trio.fail_after(6):
                    assert await _ask(llm) == "fine"
            finally:
                await llm.aclose()
            assert proxy.connections == 2
    assert len(server.requests) == 1
