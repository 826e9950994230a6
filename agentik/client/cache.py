"""Local caches a client keeps in step with the server (filled by :mod:`agentik.client.sync`).

- :class:`InMemoryJournalStore` and :class:`SqliteJournalStore` (a file; sqlite3 calls run in
  worker threads via ``anyio.to_thread``) hold journal records, upserted by id, read by seq, plus
  the cursor each sync has applied up to, written in the same transaction as the records, so a
  restarted client resumes exactly where its cache is.
- :class:`ConversationListCache` holds the conversation list (``ConversationRecord`` by id,
  listed by ``updated_at`` newest first).

Applying is idempotent by id: a record seen twice (snapshot and event overlap) is stored once.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import anyio.to_thread
import msgspec

from agentik.wire import ConversationRecord, Created, Cursor, Deleted, MessageRecord, Renamed, Touched

T = TypeVar("T")

_record_decoder = msgspec.json.Decoder(MessageRecord)
_encode = msgspec.json.Encoder().encode


class JournalStore(Protocol):
    """What a journal cache offers; implement it to keep the cache anywhere else."""

    async def upsert(
        self, records: Sequence[MessageRecord], *, key: str | None = None,
        cursor: Cursor | None = None,
    ) -> None:
        """Insert or replace ``records`` by id; if ``key`` is given, also store ``cursor`` under
        it, atomically with the records."""
        ...

    async def replace(
        self, conversation_id: str, records: Sequence[MessageRecord], cursor: Cursor | None
    ) -> None:
        """Drop everything of ``conversation_id`` (records and its cursor) and store ``records``
        and ``cursor`` instead, atomically (a resync)."""
        ...

    async def clear(self, conversation_id: str | None = None) -> None:
        """Drop the records and cursor of one conversation (None: everything)."""
        ...

    async def list(
        self, conversation_id: str | None = None, after_seq: int = 0,
        up_to_seq: int | None = None, limit: int | None = None,
    ) -> list[MessageRecord]: ...

    async def count(self, conversation_id: str | None = None, after_seq: int = 0) -> int: ...

    async def get(self, record_id: str) -> MessageRecord | None: ...

    async def load_cursor(self, key: str) -> Cursor | None: ...

    async def save_cursor(self, key: str, cursor: Cursor | None) -> None: ...

    async def close(self) -> None: ...


class InMemoryJournalStore:
    """A :class:`JournalStore` in a dict (gone with the process)."""

    def __init__(self) -> None:
        self._records: dict[str, MessageRecord] = {}
        self._cursors: dict[str, Cursor] = {}

    async def upsert(
        self, records: Sequence[MessageRecord], *, key: str | None = None,
        cursor: Cursor | None = None,
    ) -> None:
        for record in records:
            self._records[record.id] = record
        if key is not None:
            self._set_cursor(key, cursor)
        await anyio.lowlevel.checkpoint()

    async def replace(
        self, conversation_id: str, records: Sequence[MessageRecord], cursor: Cursor | None
    ) -> None:
        self._drop(conversation_id)
        for record in records:
            self._records[record.id] = record
        self._set_cursor(conversation_id, cursor)
        await anyio.lowlevel.checkpoint()

    async def clear(self, conversation_id: str | None = None) -> None:
        if conversation_id is None:
            self._records.clear()
            self._cursors.clear()
        else:
            self._drop(conversation_id)
        await anyio.lowlevel.checkpoint()

    def _drop(self, conversation_id: str) -> None:
        self._records = {
            k: r for k, r in self._records.items() if r.conversation_id != conversation_id
        }
        self._cursors.pop(conversation_id, None)

    def _set_cursor(self, key: str, cursor: Cursor | None) -> None:
        if cursor is None:
            self._cursors.pop(key, None)
        else:
            self._cursors[key] = cursor

    async def list(
        self, conversation_id: str | None = None, after_seq: int = 0,
        up_to_seq: int | None = None, limit: int | None = None,
    ) -> list[MessageRecord]:
        await anyio.lowlevel.checkpoint()
        rows = sorted(
            (
                r for r in self._records.values()
                if (conversation_id is None or r.conversation_id == conversation_id)
                and r.seq > after_seq and (up_to_seq is None or r.seq <= up_to_seq)
            ),
            key=lambda r: r.seq,
        )
        return rows if limit is None else rows[:limit]

    async def count(self, conversation_id: str | None = None, after_seq: int = 0) -> int:
        return len(await self.list(conversation_id, after_seq))

    async def get(self, record_id: str) -> MessageRecord | None:
        await anyio.lowlevel.checkpoint()
        return self._records.get(record_id)

    async def load_cursor(self, key: str) -> Cursor | None:
        await anyio.lowlevel.checkpoint()
        return self._cursors.get(key)

    async def save_cursor(self, key: str, cursor: Cursor | None) -> None:
        self._set_cursor(key, cursor)
        await anyio.lowlevel.checkpoint()

    async def close(self) -> None:
        await anyio.lowlevel.checkpoint()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    conversation_id TEXT NOT NULL,
    record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_conv_seq ON journal (conversation_id, seq);
CREATE INDEX IF NOT EXISTS journal_seq ON journal (seq);
CREATE TABLE IF NOT EXISTS cursors (
    key TEXT PRIMARY KEY,
    epoch TEXT NOT NULL,
    "offset" INTEGER NOT NULL
);
"""


class SqliteJournalStore:
    """A :class:`JournalStore` in a SQLite file (``":memory:"`` works too). Each call runs in a
    worker thread; one connection, serialised by a lock. Records are stored as their wire JSON.
    Raises ``sqlite3.Error`` if the file cannot be opened or written."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    async def __aenter__(self) -> SqliteJournalStore:
        await self._run(lambda conn: None)  # open now, so a bad path fails here
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            self._conn = conn
        return self._conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._lock:
                return fn(self._connect())

        return await anyio.to_thread.run_sync(call)

    async def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return await self._run(call)

    @staticmethod
    def _insert(conn: sqlite3.Connection, records: Sequence[MessageRecord]) -> None:
        conn.executemany(
            "INSERT OR REPLACE INTO journal (id, seq, conversation_id, record) VALUES (?, ?, ?, ?)",
            [(r.id, r.seq, r.conversation_id, _encode(r)) for r in records],
        )

    @staticmethod
    def _put_cursor(conn: sqlite3.Connection, key: str, cursor: Cursor | None) -> None:
        if cursor is None:
            conn.execute("DELETE FROM cursors WHERE key = ?", (key,))
        else:
            conn.execute(
                'INSERT OR REPLACE INTO cursors (key, epoch, "offset") VALUES (?, ?, ?)',
                (key, cursor.epoch, cursor.offset),
            )

    async def upsert(
        self, records: Sequence[MessageRecord], *, key: str | None = None,
        cursor: Cursor | None = None,
    ) -> None:
        def work(conn: sqlite3.Connection) -> None:
            self._insert(conn, records)
            if key is not None:
                self._put_cursor(conn, key, cursor)

        await self._tx(work)

    async def replace(
        self, conversation_id: str, records: Sequence[MessageRecord], cursor: Cursor | None
    ) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM journal WHERE conversation_id = ?", (conversation_id,))
            self._insert(conn, records)
            self._put_cursor(conn, conversation_id, cursor)

        await self._tx(work)

    async def clear(self, conversation_id: str | None = None) -> None:
        def work(conn: sqlite3.Connection) -> None:
            if conversation_id is None:
                conn.execute("DELETE FROM journal")
                conn.execute("DELETE FROM cursors")
            else:
                conn.execute("DELETE FROM journal WHERE conversation_id = ?", (conversation_id,))
                conn.execute("DELETE FROM cursors WHERE key = ?", (conversation_id,))

        await self._tx(work)

    async def list(
        self, conversation_id: str | None = None, after_seq: int = 0,
        up_to_seq: int | None = None, limit: int | None = None,
    ) -> list[MessageRecord]:
        sql = "SELECT record FROM journal WHERE seq > ?"
        args: list[object] = [after_seq]
        if conversation_id is not None:
            sql += " AND conversation_id = ?"
            args.append(conversation_id)
        if up_to_seq is not None:
            sql += " AND seq <= ?"
            args.append(up_to_seq)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        rows = await self._run(lambda conn: conn.execute(sql, args).fetchall())
        return [_record_decoder.decode(row[0]) for row in rows]

    async def count(self, conversation_id: str | None = None, after_seq: int = 0) -> int:
        sql = "SELECT count(*) FROM journal WHERE seq > ?"
        args: list[object] = [after_seq]
        if conversation_id is not None:
            sql += " AND conversation_id = ?"
            args.append(conversation_id)
        row = await self._run(lambda conn: conn.execute(sql, args).fetchone())
        return int(row[0])

    async def get(self, record_id: str) -> MessageRecord | None:
        row = await self._run(
            lambda conn: conn.execute("SELECT record FROM journal WHERE id = ?", (record_id,)).fetchone()
        )
        return None if row is None else _record_decoder.decode(row[0])

    async def load_cursor(self, key: str) -> Cursor | None:
        row = await self._run(
            lambda conn: conn.execute(
                'SELECT epoch, "offset" FROM cursors WHERE key = ?', (key,)
            ).fetchone()
        )
        return None if row is None else Cursor(epoch=row[0], offset=row[1])

    async def save_cursor(self, key: str, cursor: Cursor | None) -> None:
        await self._tx(lambda conn: self._put_cursor(conn, key, cursor))

    async def close(self) -> None:
        def work() -> None:
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await anyio.to_thread.run_sync(work)


class ConversationListCache:
    """The conversation list, in memory: ``list()`` newest first, ``get(id)``, and the cursor it
    is valid at. Filled by :class:`agentik.client.sync.ConversationListSync`."""

    def __init__(self) -> None:
        self._records: dict[str, ConversationRecord] = {}
        self.cursor: Cursor | None = None

    def replace(self, records: Sequence[ConversationRecord], cursor: Cursor | None) -> None:
        self._records = {r.id: r for r in records}
        self.cursor = cursor

    def clear(self) -> None:
        self.replace([], None)

    def upsert(self, record: ConversationRecord) -> None:
        self._records[record.id] = record

    def get(self, conversation_id: str) -> ConversationRecord | None:
        return self._records.get(conversation_id)

    def list(self, offset: int = 0, limit: int | None = None) -> list[ConversationRecord]:
        rows = sorted(self._records.values(), key=lambda r: (-r.updated_at, r.id))
        return rows[offset:] if limit is None else rows[offset : offset + limit]

    def __len__(self) -> int:
        return len(self._records)

    def apply(self, event: object, offset: int) -> str | None:
        """Apply one agent event (Created/Deleted/Renamed/Touched) at ``offset``. Returns the id
        of a conversation the event is about but the cache does not hold (the caller fetches
        it), else None."""
        if isinstance(event, Created):
            self._records[event.conversation.id] = event.conversation
        elif isinstance(event, Deleted):
            self._records.pop(event.conversation_id, None)
        elif isinstance(event, Renamed | Touched):
            old = self._records.get(event.conversation_id)
            if old is None:
                return event.conversation_id
            title = event.title if isinstance(event, Renamed) else old.title
            self._records[old.id] = msgspec.structs.replace(
                old, title=title, updated_at=event.updated_at, seq=offset
            )
        return None
