"""The one migration rule of both engines (each engine's DDL is its own: ``sqlite/schema.py``,
``pg/schema.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def apply_migrations(
    execute: Callable[..., Any],
    version: int,
    *,
    latest: int,
    migrations: Mapping[int, str],
    initial: Sequence[tuple[str, tuple[Any, ...]]],
    set_version: str,
    error: type[Exception],
) -> None:
    """The one migration rule of both engines, run inside the caller's transaction: refuse a
    schema newer than this code (``error``), run each script after ``version`` in order
    (statements split on ``;``), then store ``initial`` rows for a new database, or the new
    version for an upgraded one (``set_version`` with the version as its one parameter)."""
    if version > latest:
        raise error(f"database schema version {version} is newer than this agentik ({latest})")
    for target in range(version + 1, latest + 1):
        for statement in migrations[target].split(";"):
            if statement.strip():
                execute(statement)
    if version == 0:
        for sql, params in initial:
            execute(sql, params)
    elif version < latest:
        execute(set_version, (str(latest),))
