"""One runtime per database *file*, whatever path reaches it (issue 11 #1).

Two runtimes on one database would each run their own offset counter and break the cursor protocol;
the second one's start-up would also close the first one's running turns and delete its temporary
conversations. The guard is an exclusive ``flock`` on the database file itself, held for the life of
the writer: a symlink, a hard link, a ``..`` path and a bind mount all reach the same inode, so they
all meet the same lock (a ``PATH.lock`` file next to the path did not: ``ln b.db a.db`` got its own).
The OS drops the lock when the process dies, even by SIGKILL.

SQLite's own locks on that file are POSIX ``fcntl`` locks, which on Linux are separate from
``flock`` locks, so this lock never blocks SQLite (on NFS, where Linux emulates ``flock`` with
``fcntl``, it would: keep agentik's database on a local file system). Closing *any* descriptor of a
file drops the process's POSIX locks on it, so the descriptor is opened before SQLite opens the file
and closed only after the writer connection is closed (``DatabaseLock.release``).
"""

from __future__ import annotations

import fcntl
import os

from agentik.errors import StorageError


class DatabaseLock:
    """The exclusive lock on one database file. ``release()`` is idempotent."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock


def lock_database(path: str) -> DatabaseLock:
    """Lock the database file at ``path`` (created empty if missing, as SQLite would). Raises
    StorageError when another process (or another writer in this one) holds it, or when the file
    cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StorageError(f"cannot open database {path!r}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StorageError(
            f"database {path!r} is in use by another agentik process (one runtime per database "
            "file, whatever path or link reaches it: run a single hypercorn worker)"
        ) from None
    return DatabaseLock(path, fd)
