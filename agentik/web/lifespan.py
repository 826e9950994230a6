"""The app's lifespan: the runtime (``open_runtime``) runs in the app's lifespan nursery.

``before_serving`` (:func:`start_runtime`) starts a task that enters the runtime and holds it
open; ``after_serving`` (:func:`stop_runtime`) asks that task to leave the runtime's
``async with`` body and waits until the runtime has closed (running turns get their terminal
events first, then the database is closed). A runtime that dies while serving goes to
``on_fatal`` (see :mod:`agentik.web.process`).
"""

from __future__ import annotations

import os

import trio
from quart_trio import QuartTrio

from agentik.config import Config
from agentik.runtime import open_runtime
from agentik.web import auth, process
from agentik.web._state import WebState, log


def describe(exc: BaseException) -> str:
    """A one-line message for ``exc``; exception groups are flattened to their leaves."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = [describe(e) for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        return "; ".join(leaves) or "cancelled"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class StartupFailed(RuntimeError):
    """The runtime could not start; the reason was reported once already (not logged again with
    a traceback: ``AgentikApp.log_exception``)."""


async def start_runtime(app: QuartTrio, st: WebState) -> None:
    """before_serving. Raises RuntimeError with a one-line message if the runtime cannot start
    (hypercorn reports it and exits non-zero)."""
    process.die_with_supervisor()
    try:
        if st.config is None:
            try:
                st.config = Config.from_env()
            finally:
                process.setup_logging("text" if st.config is None else st.config.log_format)
        else:
            process.setup_logging(st.config.log_format)
        app.config["MAX_CONTENT_LENGTH"] = st.config.max_body_bytes
        st.authenticator = await auth.Authenticator.start(st.config)
        await app.nursery.start(hold_runtime, st, st.config)
        if st.tune_gc:
            process.tune_gc(st.config.gc_threshold)
    except Exception as exc:
        message = f"agentik cannot start: {describe(exc)}"
        st.startup_error = exc
        reported = st.report_startup and process.first_to_report()
        if reported:
            log.critical(message)
        process.end_failed_startup(exc, reported=reported)  # under hypercorn's CLI: leave now
        raise StartupFailed(message) from None
    agent = st.require_agent()
    log.info("agentik runtime started (database %s, epoch %s)", st.config.database, agent.id)
    if agent.node_address_problem is not None:
        log.info("AGENTIK_NODE_URL is not set: this node advertises the address its first "
                 "request arrives at to the other nodes, for the commands they forward")


async def hold_runtime(
    st: WebState, config: Config, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Enter the runtime and hold it until ``after_serving`` sets ``stop_requested``. Raises only
    before ``started`` (start-up errors); a later death goes to ``on_fatal``.

    The runtime is never stopped by cancelling a scope around ``open_runtime``: that would cancel
    its storage actor together with the running turns, and the turns could not store their
    terminal records. Leaving the ``async with`` body lets open_runtime stop the actors first."""
    try:
        async with open_runtime(config, llm=st.llm, tools=st.tools) as agent:
            st.agent = agent
            async with trio.open_nursery() as nursery:
                for service in st.services:
                    await nursery.start(service, agent)
                st.runtime_started = True
                task_status.started()
                if process.should_watch_sigterm(st):
                    nursery.start_soon(process.watch_sigterm, st)
                await st.stop_requested.wait()
                st.agent = None  # new requests get 503 while the runtime closes
                nursery.cancel_scope.cancel()
    except Exception as exc:
        st.agent = None
        if not st.runtime_started:
            raise
        if st.stopping:
            log.error("the runtime failed while shutting down: %s", describe(exc), exc_info=exc)
            return
        st.died = exc
        log.critical("the agentik runtime died: %s", describe(exc), exc_info=exc)
        st.on_fatal(exc)
        return
    finally:
        st.agent = None
        st.runtime_done.set()
    if st.exit_after_stop:
        # A lone worker that got SIGTERM: the runtime is closed cleanly; nobody can tell
        # hypercorn to stop, so leave the way SIGTERM would have, minus the damage.
        log.info("SIGTERM: runtime closed, exiting")
        process.flush_logs()
        os._exit(0)
    if not st.stop_requested.is_set():
        # open_runtime returned without being asked to: as fatal as a crash.
        st.died = RuntimeError("the runtime stopped by itself")
        log.critical("the agentik runtime stopped unexpectedly")
        st.on_fatal(st.died)


async def stop_runtime(st: WebState) -> None:
    """after_serving: ask the runtime holder to leave, and wait until the runtime has closed."""
    st.stopping = True
    st.stop_requested.set()
    if not st.runtime_started:
        return
    await st.runtime_done.wait()
    log.info("agentik runtime stopped")
