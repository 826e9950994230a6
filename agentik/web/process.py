"""The worker process around the app: ending it with a visible status, SIGTERM, logging set-up,
and the refusal to run without hypercorn's trio worker.

A runtime that dies while the server is up must not leave hypercorn serving a dead runtime:
hypercorn only logs a failed lifespan task and keeps serving (PITFALLS). So the default
``on_fatal`` (:func:`exit_process`) logs and ends the process with status 1 (``os._exit``; the
runtime has already closed the database in its own ``finally``, and a worker of
``hypercorn -k trio`` has no way to ask hypercorn to stop; its supervisor then exits with that
status). ``agentik serve`` and the tests pass their own ``on_fatal`` that triggers hypercorn's
graceful shutdown instead.

SIGTERM: hypercorn's supervisor handles it (graceful shutdown of its workers). A worker that gets
SIGTERM itself (a process-group kill) would die on the spot, so the app catches it there; see
:func:`watch_sigterm`.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import multiprocessing
import os
import select
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING

import trio

from agentik.errors import ConfigError
from agentik.web import logjson
from agentik.web._state import JSON, WebState, log
from agentik.web.errors import error_body
from agentik.wire import encode

if TYPE_CHECKING:
    from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

NOT_TRIO_MESSAGE = (
    "agentik needs hypercorn's trio worker: start it with `hypercorn -k trio agentik.web:app` "
    "(add `-k trio`), or use `agentik serve`"
)


def flush_logs() -> None:
    for handler in [*logging.getLogger("agentik").handlers, *logging.getLogger().handlers]:
        handler.flush()
    sys.stderr.flush()


def terminate(status: int, *, end_supervisor: bool = True) -> None:
    """End the process now with ``status`` (the runtime is already closed, or never opened).

    In a worker of hypercorn's supervisor (``hypercorn -k trio``), the worker's status is lost:
    hypercorn 0.18's ``run()`` exits 0 when its only worker fails (it calls ``_join_exited`` a
    second time on the already emptied process list, which returns 0; upstream
    pgjones/hypercorn#269, fix proposed in PR #372). No code of ours runs in the supervisor (it
    never imports the app), and it treats SIGTERM/SIGINT as a clean shutdown and SIGHUP as a
    reload, so a signal it cannot handle is the only way to make its status non-zero: it is
    killed (SIGKILL, status 137) to make the failure visible to whoever restarts the server. It
    holds nothing but the listening socket and the shutdown event's semaphores, which are
    released first (:func:`release_supervisor_semaphores`), so its resource tracker has no
    "leaked semaphore objects" to warn about after the one line that said why."""
    flush_logs()
    supervisor = supervisor_pid()
    if supervisor is not None:
        if end_supervisor:
            release_supervisor_semaphores()
        _wait_gone(supervisor, kill=end_supervisor)
    os._exit(status)


def _wait_gone(pid: int, *, kill: bool) -> None:
    """SIGKILL ``pid`` (``kill``), and wait (at most 5 s) until it has exited: the reporting
    worker, so that a sibling looking after it finds its supervisor gone
    (:func:`first_to_report`); a silent sibling, so that the supervisor does not see a worker
    end and clean up the semaphores the reporting worker is releasing (its traceback and
    warnings would follow the report)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone already, or no pidfd here
        fd = None
    if kill:
        os.kill(pid, signal.SIGKILL)
    if fd is not None:
        select.select([fd], [], [], 5.0)  # readable once the process has exited
        os.close(fd)


#: held until this worker exits: its claim to report the start-up failure of its server
_report_claim: socket.socket | None = None


def first_to_report() -> bool:
    """Whether this process reports its start-up failure: always, except in a worker of
    hypercorn's supervisor (``-w 2``), where every worker fails alike on a bad setting and
    only the first says so. It claims a name (an abstract socket named by the supervisor's
    pid, held until this process exits) while the supervisor lives; the first to report
    kills the supervisor and waits for its end before exiting (:func:`terminate`), so a later
    worker finds the name taken or the supervisor gone, and ends in silence."""
    global _report_claim
    parent = multiprocessing.parent_process()
    if parent is None or not sys.platform.startswith("linux"):
        return True
    if parent.pid is None or os.getppid() != parent.pid:
        return False  # the supervisor is gone: a sibling reported and ended it
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        claim.bind(f"\0agentik-startup-failed-{parent.pid}")
    except OSError:
        claim.close()
        return False  # a sibling is reporting
    _report_claim = claim
    return os.getppid() == parent.pid


def release_supervisor_semaphores() -> None:
    """Unlink the named semaphores this worker shares with hypercorn's supervisor (the
    ``shutdown_event`` it passed to the worker: an Event is five semaphores) and tell the
    supervisor's resource tracker (whose pipe a spawned worker inherits) that they are gone.
    What ``SemLock._cleanup`` would do in the supervisor at a normal exit; without it, killing
    the supervisor made the tracker print "There appear to be 5 leaked semaphore objects to
    clean up at shutdown" after the start-up failure. Best effort: the process is ending."""
    from multiprocessing.synchronize import SemLock

    names = {
        name for obj in gc.get_objects()
        if isinstance(obj, SemLock) and (name := getattr(getattr(obj, "_semlock", None), "name", None))
    }
    for name in names:
        with contextlib.suppress(Exception):  # already unlinked, or the tracker is gone
            SemLock._cleanup(name)  # type: ignore[attr-defined]


def tune_gc(threshold: int) -> None:
    """The server process's garbage collector, once the runtime has started (``threshold`` 0:
    left as it is). What start-up made (modules, types, the app, the runtime's actors and
    schemas: about 100k objects) lives as long as the process, yet every full collection walked
    it; frozen, it is no longer walked. A young collection every ``threshold`` new container
    objects instead of 700 lets most of a turn's and a token's objects die by reference count
    first: measured at 100 concurrent turns, the collector's CPU went from about 235 ms to 25 ms
    a run, the server's from 1.25 to 1.05-1.17 s, with the same resident memory (BENCHMARKS.md,
    seventh pass)."""
    if threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)
    log.info("garbage collector: %d start-up objects frozen, a collection every %d new objects",
             gc.get_freeze_count(), threshold)


#: the exit status of a start-up failure, as ``agentik serve``: 2 for a bad setting, else 1 (a
#: database in use, ...)
BAD_SETTING, STARTUP_FAILED = 2, 1


def end_failed_startup(exc: BaseException, *, reported: bool = True) -> None:
    """After a start-up failure (``exc``) was reported in its one line: under hypercorn's command
    line, end the process here, before hypercorn adds its own report. A worker of its supervisor
    (``hypercorn -k trio``, one or more workers) ends through :func:`terminate`; the app run in
    hypercorn's own process (``-w 0``) exits :data:`BAD_SETTING` or :data:`STARTUP_FAILED`,
    where hypercorn would print the failure again as a 40-line traceback and exit 1. Embedded
    (``agentik serve``, ``hypercorn.trio.serve`` in tests) it returns, and the caller's lifespan
    fails as usual. A worker that did not report (``reported``: a sibling did, see
    :func:`first_to_report`) ends alone, in silence."""
    if multiprocessing.parent_process() is not None or _run_by_hypercorn_cli():
        # A worker: also one whose supervisor a sibling already ended (it would otherwise
        # print hypercorn's traceback of the failure after the sibling's line).
        # Only the worker that reported ends the supervisor: two releasing its semaphores at
        # once left its resource tracker warning about them.
        terminate(BAD_SETTING if isinstance(exc, ConfigError) else STARTUP_FAILED,
                  end_supervisor=reported)


def _run_by_hypercorn_cli() -> bool:
    """True in the process of ``hypercorn ...`` / ``python -m hypercorn ...`` itself."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return "hypercorn.__main__" in sys.modules or getattr(spec, "name", None) == "hypercorn.__main__"


def exit_process(exc: BaseException) -> None:
    """Default ``on_fatal``: leave with a failure status (see the module docstring)."""
    log.critical("exiting with a failure status so that a supervisor can restart the server")
    terminate(1)


def supervisor_pid() -> int | None:
    """The pid of hypercorn's supervisor if this process is one of its spawned workers."""
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid == os.getppid():
        return parent.pid
    return None


_PR_SET_PDEATHSIG = 1


def die_with_supervisor() -> None:
    """In a worker of hypercorn's supervisor, ask Linux to send this process SIGTERM when the
    supervisor dies (``prctl(PR_SET_PDEATHSIG)``), which :func:`watch_sigterm` turns into a clean
    shutdown. Without it, ``hypercorn -k trio -w 2`` left an orphan: the worker that could not
    take the database lock killed the supervisor (:func:`terminate`), and the other worker went on
    serving with ppid 1, holding the database and the port. A no-op elsewhere (not a worker, not
    Linux)."""
    supervisor = supervisor_pid()
    if supervisor is None or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    except (OSError, AttributeError) as exc:  # pragma: no cover - every Linux has prctl
        log.warning("cannot follow the supervisor's death: %s", exc)
        return
    if os.getppid() != supervisor:  # it died before the request: nobody will signal us
        os.kill(os.getpid(), signal.SIGTERM)


async def watch_sigterm(st: WebState) -> None:
    """Under ``hypercorn -k trio`` the app runs in a spawned worker whose SIGTERM is left at the
    default (die at once). A signal sent to the whole process group (systemd's default, timeout(1),
    a container runtime's process-group kill) would then kill the worker mid-turn with the
    database open. So when nobody else handles SIGTERM here, catch it: in a hypercorn worker, pass
    it on to the supervisor, whose shutdown event then stops this worker gracefully; in a lone
    worker, close the runtime and then exit (``exit_after_stop``)."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            supervisor = supervisor_pid()
            if supervisor is None:
                st.exit_after_stop = True
                st.stop_requested.set()
                return
            log.info("SIGTERM: asking hypercorn (pid %d) for a graceful shutdown", supervisor)
            os.kill(supervisor, signal.SIGTERM)


def should_watch_sigterm(st: WebState) -> bool:
    return (
        st.handle_sigterm
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )


def setup_logging(log_format: str = "text") -> None:
    """Give agentik's loggers a stderr handler when nobody configured logging (plain
    ``hypercorn`` configures only its own loggers, so INFO lines would be lost); with
    ``AGENTIK_LOG_FORMAT=json`` hypercorn's own handlers get the JSON formatter too."""
    if log_format == "json":
        logjson.use_json_for_hypercorn()
    root = logging.getLogger()
    ours = logging.getLogger("agentik")
    if root.handlers or ours.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logjson.formatter(log_format))
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)


async def refuse_without_trio(
    scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
) -> None:
    """Served by an asyncio worker by mistake: fail start-up at once, saying what to do."""
    print(f"ERROR: {NOT_TRIO_MESSAGE}", file=sys.stderr, flush=True)
    if supervisor_pid() is not None:
        terminate(1)  # a worker of hypercorn's supervisor: see terminate
    if scope["type"] == "lifespan":
        await receive()
        await send({"type": "lifespan.startup.failed", "message": NOT_TRIO_MESSAGE})
    elif scope["type"] == "http":
        body = encode(error_body("not_trio", NOT_TRIO_MESSAGE))
        await send({
            "type": "http.response.start", "status": 500,
            "headers": [(b"content-type", JSON.encode())],
        })
        await send({"type": "http.response.body", "body": body, "more_body": False})
    else:
        await send({"type": "websocket.close", "code": 1011, "reason": "agentik needs -k trio"})
