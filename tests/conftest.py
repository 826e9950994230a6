"""Shared fixtures: a scripted OpenAI-compatible server on 127.0.0.1 and a config pointing at it
with a fresh SQLite file per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentik.config import Config
from tests.scripted_openai import ScriptedOpenAI, open_scripted_openai


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedOpenAI]:
    async with open_scripted_openai() as server:
        yield server


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "agentik.db")


@pytest.fixture
def config(scripted: ScriptedOpenAI, db_path: str) -> Config:
    return Config(
        db_path=db_path,
        openai_base_url=scripted.base_url,
        openai_api_key="test-key",
        openai_model="scripted",
        llm_max_retries=0,
        llm_timeout=10.0,
        system_prompt="You are a test assistant.",
    )
