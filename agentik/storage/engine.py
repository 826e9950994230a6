"""The storage seam: what the StorageActor needs from a database engine, written once.

Two engines implement it: SQLite (``sqlite/``: ``writer.Writer`` + ``reader.Reader``, the
embedded default, one node) and PostgreSQL (``pg/``: ``writer.PgWriter`` + ``reader.PgReader`` +
``feed``, several nodes on one database). The contract both keep (docs/PROTOCOL.md §6, docs/SCALEOUT.md):

- one writer per node; ``commit_batch`` applies a batch of ops in ONE transaction and bumps the
  one counter inside it, so offsets are dense and in commit order; an op refused on purpose
  (AgentikError) is answered with its error and leaves no hole; any database failure fails the
  whole batch (StorageError) and nothing of it is stored;
- every seq has exactly one outbox row and trimming removes only a prefix, so the retained offsets
  are one contiguous range and gap detection is arithmetic;
- events reach the hub only after their commit, in offset order. SQLite: the writer's own batch
  result is published (it is the only writer). PostgreSQL: a feed task reads the outbox after its
  cursor and publishes every node's events in offset order (``publishes_commits`` False); its own
  batch's events it publishes as the writer returned them when nothing came before them;
- a failed batch is *transient* (the store refuses writes for now: disk or database full,
  read-only, I/O error, lost connection, a revoked privilege) unless the database said the
  batch itself is wrong (:func:`is_transient`); while writes are refused, the StorageActor
  probes the engine with :func:`probe_write` so readiness (``/readyz``) returns without
  traffic;
- readers: ``run(fn, *args)`` runs a query function of ``agentik.storage.sqlite.queries`` with a pooled
  connection in a worker thread (the functions are written once, in SQL both engines accept);
  ``outbox_page`` is the one read whose SQL differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agentik.storage.reads import Reads

if TYPE_CHECKING:
    from agentik.storage import ops
    from agentik.storage.types import BatchResult


def is_postgres_url(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


#: DB-API (PEP 249) error classes that say the batch itself is wrong (a constraint, bad SQL or
#: data): retrying the same write cannot help, and the store still accepts other writes. Both
#: sqlite3 and psycopg name their classes so.
_PERMANENT = frozenset({"IntegrityError", "ProgrammingError", "DataError", "NotSupportedError",
                        "InterfaceError"})


#: SQLSTATEs that say the store refuses writes for now although their DB-API class says the
#: batch is wrong: 42501 insufficient_privilege (psycopg's InsufficientPrivilege is a
#: ProgrammingError): an operator revoked the role's INSERT/UPDATE; granted back, the same write
#: succeeds. (SQLite's equivalent, "attempt to write a readonly database", is an
#: OperationalError: transient by its class.)
_TRANSIENT_SQLSTATES = frozenset({"42501"})


def is_transient(exc: BaseException) -> bool:
    """Whether a failed commit (a StorageError raised from the engine's error) may succeed
    later: True for the store refusing writes (SQLite "database or disk is full", "attempt to
    write a readonly database", "disk I/O error", "database is locked"; PostgreSQL disk full,
    a read-only transaction, a lost connection, insufficient privilege), False when the
    database blamed the batch."""
    cause = exc.__cause__
    if cause is None:
        return True
    if getattr(cause, "sqlstate", None) in _TRANSIENT_SQLSTATES:
        return True
    return not any(cls.__name__ in _PERMANENT for cls in type(cause).__mro__)


def probe_write(writer: WriterEngine) -> None:
    """A cheap write that must reach the store, for a writer whose last commit failed: the
    engine's own ``probe()`` when it has one (SQLite: a row of a few pages committed and
    removed), else an empty batch (PostgreSQL: its one statement still updates the counter row,
    a real write, and reconnects a broken connection). Blocking; raises StorageError."""
    probe: Callable[[], None] | None = getattr(writer, "probe", None)
    if probe is not None:
        probe()
    else:
        writer.commit_batch([])


class WriterEngine(Protocol):
    """The node's single writer connection; every method is blocking (call it in a worker thread,
    one call at a time)."""

    epoch: str
    #: the next offset this writer knows of (head + 1)
    next_seq: int
    #: the lowest retained offset (next_seq when the outbox is empty)
    oldest: int
    #: True: ``commit_batch``'s events are this node's to publish (SQLite). False: a feed
    #: publishes every node's events in offset order (PostgreSQL); ``BatchResult.events`` are
    #: still the batch's committed events, for the feed and the commit metrics.
    publishes_commits: bool

    def commit_batch(self, batch: list[ops.AnyOp]) -> BatchResult: ...

    def close(self) -> None: ...


F = TypeVar("F")


class StepWriter(WriterEngine, Protocol[F]):
    """A writer that commits in steps (PostgreSQL's ``PgWriter``), so the writer thread plans
    batch k+1 while k's statement runs (``committer._run_pipelined``); ``F`` is its batch in
    flight. Every method is blocking, like ``commit_batch`` (which is begin, land, result)."""

    def begin(self, batch: list[ops.AnyOp]) -> F: ...

    def follow(self, batch: list[ops.AnyOp], after: F) -> F | None: ...

    def launch(self, flight: F) -> bool: ...

    def land(self, flight: F) -> None: ...

    def result(self, flight: F) -> BatchResult: ...

    def socket(self) -> int: ...

    def answer_remaining(self) -> float | None: ...


#: the read side of either engine (``reads.Reads``: typed calls, each engine's own SQL); its
#: connection type is the engine's own, which nothing outside the engine touches
ReaderEngine = Reads[Any]
