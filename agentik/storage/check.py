"""``agentik check``: is the configured database there and writable? Nothing is changed: a
write transaction is begun and rolled back. A server holding the database does not make it
fail (its lock is on writers that stay; this check only waits ``timeout`` for a moment of
quiet)."""

from __future__ import annotations

import os
import sqlite3
import tempfile

from agentik.config import Config
from agentik.errors import StorageError, missing_extra


def check_database(config: Config, timeout: float = 5.0) -> str:
    """A one-line description of what was found; raises StorageError saying what is wrong.
    Blocking (call it in a worker thread)."""
    if config.database_url:
        return _check_postgres(config.database_url, timeout)
    path = config.db_path
    if not os.path.exists(path):
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise StorageError(f"{path}: the folder {folder} does not exist")
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise StorageError(f"{path}: cannot create files in {folder}: {exc.strerror}") from None
        return f"{path}: does not exist yet; its folder is writable (made at the first start)"
    try:
        conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            tables = conn.execute(
                "SELECT value FROM meta WHERE key='schema_version'"
            ).fetchone() if _has_meta(conn) else None
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StorageError(f"{path}: {exc}") from None
    schema = f"schema version {tables[0]}" if tables else "no agentik schema yet"
    return f"{path}: writable, {schema}"


def _has_meta(conn: sqlite3.Connection) -> bool:
    return conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
    ).fetchone() is not None


def _check_postgres(url: str, timeout: float) -> str:
    try:
        import psycopg
    except ImportError as exc:
        raise missing_extra("AGENTIK_DATABASE_URL", "PostgreSQL needs psycopg", "postgres",
                            exc) from None
    try:
        with psycopg.connect(url, connect_timeout=max(1, int(timeout))) as conn:
            read_only = conn.execute("SHOW transaction_read_only").fetchone()
    except psycopg.Error as exc:
        raise StorageError(f"PostgreSQL: {str(exc).strip().splitlines()[0]}") from None
    if read_only and read_only[0] == "on":
        raise StorageError("PostgreSQL: the server is read-only")
    return "PostgreSQL: connected, writable"
