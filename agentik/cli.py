"""The ``agentik`` console script.

``agentik serve``  runs the web app (``agentik.web``) in hypercorn's trio worker, in this process,
                   on ``AGENTIK_PORT`` (docs/PROTOCOL.md §1). SIGINT/SIGTERM shut down gracefully (exit 0); a
                   runtime that dies while serving shuts the server down too (exit 1).
``agentik chat``   a terminal chat against a running server (``agentik.client.chat``):
                   ``--url`` (default AGENTIK_URL, else http://127.0.0.1:AGENTIK_PORT),
                   ``--token`` (default AGENTIK_TOKEN), ``--conversation ID``.

Exit codes: 0 clean shutdown, 1 the runtime failed (at start-up or later), 2 bad configuration or
usage.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import trio

from agentik import config_values as values
from agentik.config import Config
from agentik.errors import ConfigError

if TYPE_CHECKING:
    from hypercorn.config import Config as HypercornConfig
    from hypercorn.config import Sockets

log = logging.getLogger("agentik.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentik", description="agent runtime server on trio")
    parser.add_argument("--version", action="version", version=f"agentik {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the HTTP/SSE/WebSocket server")
    serve.add_argument("--host", default="127.0.0.1",
                       help="interface to bind (default 127.0.0.1; 0.0.0.0 for all)")
    serve.add_argument("--port", type=int, default=None,
                       help="port (default AGENTIK_PORT, else 8080; 0 picks a free port)")
    serve.add_argument("--graceful-timeout", type=float, default=3.0,
                       help="seconds open streams get to finish at shutdown (default 3)")

    sub.add_parser("check", help="check the configuration (database, model, MCP servers) "
                                 "without serving; exit 0 when everything is usable")

    chat = sub.add_parser("chat", help="chat from the terminal with a running server")
    chat.add_argument("--url", default=None,
                      help="server URL (default AGENTIK_URL, else http://127.0.0.1:AGENTIK_PORT)")
    chat.add_argument("--token", default=None, help="bearer token (default AGENTIK_TOKEN)")
    chat.add_argument("--conversation", default=None, metavar="ID",
                      help="continue this conversation (default: pick one or start a new one)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve_command(args)
    if args.command == "chat":
        return _chat(args)
    if args.command == "check":
        return _check()
    raise AssertionError(args.command)  # argparse rejects unknown commands


def _version() -> str:
    import agentik

    return agentik.__version__


def config_lines(exc: ConfigError) -> list[str]:
    """What a bad setting says, one line each (a users file lists every mistake)."""
    problems: list[str] | None = getattr(exc, "problems", None)
    return [f"{exc.variable}: {p}" for p in problems] if problems else str(exc).splitlines()


def _check() -> int:
    """``agentik check``: one line per item; 0 when all are usable, 1 when one is not, 2 for a
    bad setting or a missing extra (as ``agentik serve``)."""
    from agentik.check import Item, run_checks

    try:
        config = Config.from_env()
    except ConfigError as exc:
        print(Item("config", False, str(exc)).line())
        return 2
    logging.basicConfig(level=logging.ERROR)  # the lines below say what went wrong

    def emit(item: Item) -> None:
        print(item.line(), flush=True)

    return trio.run(run_checks, config, emit)


def _chat_target(args: argparse.Namespace) -> tuple[str, str | None]:
    """The chat's server URL and token, under the rules of the server's settings
    (:mod:`agentik.config_values`). Raises ValueError: one line naming the option or variable
    (a token is never shown)."""
    url = args.url or os.environ.get("AGENTIK_URL")
    where = "--url" if args.url else "AGENTIK_URL"
    if not url:
        port = os.environ.get("AGENTIK_PORT") or "8080"
        try:
            url = f"http://127.0.0.1:{values.port(port)}"
        except ValueError as exc:
            raise ValueError(f"AGENTIK_PORT {port!r} {exc}") from None
    if not url.startswith(("http://", "https://")):
        if "://" in url:
            raise ValueError(f"{where} {url!r} is not an http:// or https:// URL")
        raise ValueError(f"{where} {url!r} has no scheme: add http:// (e.g. http://{url}) "
                         "or https://")
    try:
        values.url(url)
    except ValueError as exc:
        raise ValueError(f"{where} {url!r} {exc}") from None
    token = args.token or os.environ.get("AGENTIK_TOKEN") or None
    if token is not None:
        try:
            values.token(token)
        except ValueError as exc:
            raise ValueError(f"{'--token' if args.token else 'AGENTIK_TOKEN'} {exc}") from None
    return url, token


def _chat(args: argparse.Namespace) -> int:
    from agentik.client.chat import run_chat

    try:
        url, token = _chat_target(args)
    except ValueError as exc:
        print(f"agentik chat: {exc}", file=sys.stderr)
        return 2
    # Quiet: the chat prints its own messages; library log lines would garble the terminal.
    logging.basicConfig(level=logging.WARNING)
    return trio.run(run_chat, url, token, args.conversation)


def _serve_command(args: argparse.Namespace) -> int:
    try:
        config = Config.from_env()
    except ConfigError as exc:
        _bad_configuration(exc)
        return 2
    if args.port is not None:
        if not 0 <= args.port <= 65535:
            print(f"agentik: --port must be 0..65535, got {args.port}", file=sys.stderr)
            return 2
        config = config.replace(port=args.port)
    from agentik.web import logjson

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logjson.formatter(config.log_format))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    # One line per LLM request from the HTTP client library is noise next to the access log.
    for noisy in ("httpx2", "httpcore2", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return trio.run(serve, config, args.host, args.graceful_timeout)


async def serve(config: Config, host: str = "127.0.0.1", graceful_timeout: float = 3.0) -> int:
    """Serve ``create_app(config)`` with hypercorn until SIGINT/SIGTERM (returns 0) or until the
    runtime dies (returns 1). A start-up failure prints one line and nothing after it: 2 for a
    bad setting (the line names the variable) or a port in use (the line names the port), 1 for
    anything else (a database in use by another server, ...)."""
    import hypercorn.trio.run
    from hypercorn.utils import wrap_app

    from agentik.web.app import create_app
    from agentik.web.lifespan import describe

    died = trio.Event()

    def on_fatal(exc: BaseException) -> None:
        died.set()  # the shutdown trigger below stops hypercorn gracefully

    hc = _hypercorn_config(config, host, graceful_timeout)
    # Bind before the runtime starts: a port in use is one clear line, not a runtime started
    # for nothing and a traceback.
    sockets = _bind(hc, config, host)
    if sockets is None:
        return 2
    config = _with_node_url(config, host, sockets)
    app = create_app(config, on_fatal=on_fatal, report_startup=False, tune_gc=True)
    # hypercorn logs "Running on ..." even when the lifespan start-up has just failed.
    quiet = _DropWhile(lambda: app.agentik.startup_error is not None)
    logging.getLogger("hypercorn.error").addFilter(quiet)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            await hypercorn.trio.run.worker_serve(
                wrap_app(app, hc.wsgi_max_body_size, None), hc, sockets=sockets,
                shutdown_trigger=partial(_until_signal_or_death, signals, died),
            )
        except Exception as exc:
            cause = app.agentik.startup_error
            if isinstance(cause, ConfigError):
                _bad_configuration(cause)
                return 2
            print(f"agentik: cannot start: {describe(cause or exc)}", file=sys.stderr)
            return 1
        finally:
            logging.getLogger("hypercorn.error").removeFilter(quiet)
            for sock in sockets.insecure_sockets:
                sock.close()
    return 1 if died.is_set() else 0


def _bad_configuration(exc: ConfigError) -> None:
    """One line per mistake (an agents file or a users file may have several)."""
    for line in config_lines(exc):
        print(f"agentik: bad configuration: {line}", file=sys.stderr)


def _hypercorn_config(config: Config, host: str, graceful_timeout: float) -> HypercornConfig:
    import hypercorn.config

    hc = hypercorn.config.Config()
    hc.bind = [f"{host}:{config.port}"]
    hc.accesslog = None  # agentik logs one line per request itself
    if config.log_format == "json":
        # hypercorn's own lines through the root handler (JSON) instead of its own handler
        hc.errorlog = logging.getLogger("hypercorn.error")
    hc.graceful_timeout = graceful_timeout
    hc.keep_alive_timeout = config.keep_alive_timeout
    hc.backlog = config.backlog
    # agentik's own check closes oversized messages with 1009 cleanly (waiting for the client's
    # close reply); hypercorn's limit, which just drops the connection, is only a backstop for
    # messages far over it.
    hc.websocket_max_message_size = 2 * config.max_body_bytes
    return hc


def _bind(hc: HypercornConfig, config: Config, host: str) -> Sockets | None:
    """The listening sockets, or None after one line saying why not (the port, if in use)."""
    import errno

    try:
        sockets = hc.create_sockets()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            print(f"agentik: port {config.port} on {host} is already in use: stop the other "
                  "server or choose another port (AGENTIK_PORT or --port)", file=sys.stderr)
        else:
            print(f"agentik: cannot listen on {host}:{config.port}: {exc.strerror or exc}",
                  file=sys.stderr)
        return None
    for sock in sockets.insecure_sockets:
        sock.listen(hc.backlog)
    return sockets


def _with_node_url(config: Config, host: str, sockets: Sockets) -> Config:
    """A cluster node bound to one address knows the base URL the other nodes forward commands
    to (port 0: the one picked); AGENTIK_NODE_URL, when set, wins. A wildcard bind (0.0.0.0,
    ::) names no address: the node learns it from the requests it gets (``web.app``)."""
    if not config.database_url or config.node_url or host.strip("[]") in ("", "0.0.0.0", "::"):
        return config
    port = sockets.insecure_sockets[0].getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return config.replace(node_url=f"http://{shown}:{port}")


async def _until_signal_or_death(signals: AsyncIterator[int], died: trio.Event) -> None:
    """hypercorn's shutdown trigger: returns at SIGINT/SIGTERM or when the runtime died."""
    async with trio.open_nursery() as nursery:

        async def on_signal() -> None:
            async for signum in signals:
                log.info("%s: shutting down", signal.Signals(signum).name)
                break
            nursery.cancel_scope.cancel()

        async def on_death() -> None:
            await died.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(on_signal)
        nursery.start_soon(on_death)


class _DropWhile(logging.Filter):
    def __init__(self, drop: Callable[[], bool]) -> None:
        super().__init__()
        self._drop = drop

    def filter(self, record: logging.LogRecord) -> bool:
        return not self._drop()


if __name__ == "__main__":
    sys.exit(main())
