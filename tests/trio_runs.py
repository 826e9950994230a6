"""How a test's trio run ends, where pytest-timeout and pytest-trio get it wrong (a pytest plugin,
loaded by ``tests/conftest.py``).

The per-test time limit:

pytest-timeout's own way (SIGALRM raising in the main thread) raises in the middle of trio's
run loop: the test fails, but trio's run state is left behind, so every later test of the session
fails with "Attempted to call run() from inside a run()". Here the alarm instead cancels
everything in the test's trio run (``run_sync_soon`` is safe from a signal handler), the test
fails with "Timeout", and the next test starts on a clean loop. Outside a trio run (a sync test
or fixture) pytest-timeout's own handler applies. A run that does not end within
:data:`GRACE` seconds of the cancel (a thread that cannot be cancelled, a shielded wait) ends
the whole session, with every thread's stack, instead of hanging it.

A skip inside a trio test: pytest-trio 0.8 re-raises it as ``pytest.skip()``, without its
reason (``-rs`` printed "Skipped" at pytest's own line); the original is raised instead.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Generator
from types import FrameType
from typing import Any

import pytest
import pytest_timeout
import trio

#: seconds a cancelled test run has to end before the session is ended
GRACE = 20.0
TIMED_OUT = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own thread method

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        __tracebackhide__ = True
        if not settings.disable_debugger_detection and pytest_timeout.is_debugging():
            return
        try:
            token: trio.lowlevel.TrioToken | None = trio.lowlevel.current_trio_token()
        except RuntimeError:
            token = None
        if token is None:  # not in a trio run: pytest-timeout's way is safe here
            pytest_timeout.timeout_sigalrm(item, settings)
            return
        item.stash[TIMED_OUT] = settings.timeout
        token.run_sync_soon(_cancel_everything)
        signal.signal(signal.SIGALRM, lambda *_: _end_session(item, settings.timeout))
        signal.setitimer(signal.ITIMER_REAL, GRACE)

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # read by pytest-timeout
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


def _cancel_everything() -> None:
    """In the trio run (``run_sync_soon``): cancel every task, the test's main task included."""
    for nursery in trio.lowlevel.current_root_task().child_nurseries:
        nursery.cancel_scope.cancel()


def _end_session(item: pytest.Item, timeout: float) -> None:
    terminal = item.config.get_terminal_writer()
    terminal.sep("+", title=f"Timeout: {item.nodeid} did not end {GRACE:g} s after its cancel")
    pytest_timeout.dump_stacks(terminal)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    outcome = yield
    timeout = item.stash.get(TIMED_OUT, None)
    if timeout is not None:
        outcome.force_exception(pytest.fail.Exception(
            f"Timeout (>{timeout:g}s): the test was cancelled (pytest-timeout, tests/trio_runs.py)",
            pytrace=False))
        return
    skipped = outcome.excinfo[1] if outcome.excinfo else None
    if isinstance(skipped, pytest.skip.Exception) and not skipped.msg:
        leaves = _leaves(skipped.__context__)
        if len(leaves) == 1 and isinstance(leaves[0], pytest.skip.Exception):
            outcome.force_exception(leaves[0])


def _leaves(exc: BaseException | None) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [] if exc is None else [exc]
