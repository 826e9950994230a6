"""Shared fixtures: a scripted OpenAI-compatible server on 127.0.0.1 and a config pointing at it
with a fresh SQLite file per test; the time limit of the tests marked slow.

``AGENTIK_TEST_ENGINE=postgres`` runs the suite on PostgreSQL (CI's second pass, scripts/test.sh):
every config a test makes with the ``config`` fixtures or ``webutil.make_config`` then names a
fresh schema of the test database (:func:`engine_url`); a test of SQLite's own behaviour (its
file, its disk) is marked ``sqlite_only`` and left out of that pass, and so is a test that makes
no config (it would run the same twice)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentik.config import Config
from tests.scripted_openai import ScriptedOpenAI, open_scripted_openai

#: the per-test time limit, trio-aware (tests/trio_runs.py)
pytest_plugins = ["tests.trio_runs"]

#: seconds a test marked ``slow`` may take (the default, pyproject's ``timeout``, is for the rest)
SLOW_TIMEOUT = 900


def _slow_timeouts(items: list[pytest.Item]) -> None:
    """A slow test without its own ``@pytest.mark.timeout`` gets :data:`SLOW_TIMEOUT`."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedOpenAI]:
    async with open_scripted_openai() as server:
        yield server


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "agentik.db")


#: the engine the suite's configs use (module docstring)
ENGINE = os.environ.get("AGENTIK_TEST_ENGINE", "sqlite")
#: the fixtures and helpers through which a test's storage follows ENGINE
_ENGINE_FIXTURES = {"config", "server", "client", "engine"}
_url: list[str | None] = [None]


def engine_url() -> str | None:
    """The database URL a config of the running test names: its PostgreSQL schema when the
    suite runs on PostgreSQL, else None (its SQLite file)."""
    return _url[0]


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The running test's database per ENGINE (:func:`engine_url`); a test that makes its
    config with ``make_config`` asks for it."""
    _url[0] = request.getfixturevalue("pg_url") if ENGINE == "postgres" else None
    try:
        yield _url[0]
    finally:
        _url[0] = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests' time limit; on PostgreSQL (ENGINE): only the tests whose storage follows
    the engine."""
    _slow_timeouts(items)
    if ENGINE != "postgres":
        return
    keep, drop = [], []
    for item in items:
        follows = _ENGINE_FIXTURES & set(getattr(item, "fixturenames", ()))
        (keep if follows and item.get_closest_marker("sqlite_only") is None else drop).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)


@pytest.fixture
def config(scripted: ScriptedOpenAI, db_path: str, engine: str | None) -> Config:
    """On the suite's engine (module docstring)."""
    return Config(
        db_path=db_path,
        database_url=engine,
        openai_base_url=scripted.base_url,
        openai_api_key="test-key",
        openai_model="scripted",
        llm_max_retries=0,
        llm_timeout=10.0,
        system_prompt="You are a test assistant.",
    )


# --- PostgreSQL (the scale-out engine) ----------------------------------------------------------

#: the test database; a schema per test isolates tests from each other
PG_BASE_URL = os.environ.get("AGENTIK_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def pg_available() -> str | None:
    """None when PostgreSQL answers, else why not. Under CI=true a missing PostgreSQL is a
    failure, never a skip."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e '.[postgres]')"
    try:
        psycopg.connect(PG_BASE_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"PostgreSQL is not reachable at {PG_BASE_URL}: {exc}"
    return None


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh schema in the test database; the URL's search_path points at it."""
    why = pg_available()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(PG_BASE_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
    sep = "&" if "?" in PG_BASE_URL else "?"
    try:
        yield f"{PG_BASE_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_BASE_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]


@dataclass(frozen=True)
class StorageTarget:
    """Where a storage test runs: SQLite file ``path``, or PostgreSQL ``url`` when set."""

    engine: str
    path: str
    url: str | None


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, db_path: str) -> StorageTarget:
    if request.param == "sqlite":
        return StorageTarget("sqlite", db_path, None)
    return StorageTarget("postgres", db_path, request.getfixturevalue("pg_url"))
