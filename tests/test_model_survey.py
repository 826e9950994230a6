"""What the runtime learns by asking the model's server (issue 25): the context window where the
server's listing says (vLLM, llama.cpp, LM Studio, Ollama), so the first round already carries an
output budget; whether the server answers (``/readyz``: a degraded reason, still 200); and what
it says when no model is configured. The real openai SDK and runtime against the scripted
server, which answers the listings as those servers do."""

from __future__ import annotations

import logging
from typing import Any

import httpx2
import pytest
import trio

from agentik import Config, open_runtime
from agentik.llm.openai_window import (
    entry_window,
    lmstudio_window,
    ollama_ps_window,
    ollama_show_window,
    props_window,
    trained_window,
)
from agentik.runtime import NO_MODEL
from tests.scripted_openai import ScriptedOpenAI
from tests.test_runtime import run_turn
from tests.webutil import serve_app

# --- what each server's answer says (pure) ---------------------------------------------------------


def test_the_window_in_each_servers_own_words() -> None:
    assert entry_window({"id": "m", "max_model_len": 8192}) == 8192  # vLLM
    llama = {"id": "m", "meta": {"n_ctx": 4096, "n_ctx_train": 131072}}
    assert entry_window(llama) == 4096  # llama.cpp: the allocated window, not the trained one
    assert entry_window({"id": "m", "meta": {"n_ctx_train": 131072}}) is None
    assert trained_window({"id": "m", "meta": {"n_ctx_train": 131072}}) == 131072
    assert entry_window({"id": "m", "loaded_context_length": 16384,
                         "max_context_length": 32768}) == 16384  # LM Studio, loaded
    assert entry_window({"id": "m", "context_length": 65536}) == 65536
    assert entry_window({"id": "m", "object": "model"}) is None  # OpenAI's own listing
    assert entry_window({"id": "m", "max_model_len": True}) is None  # not a number
    assert props_window({"default_generation_settings": {"n_ctx": 2048}}) == 2048
    assert props_window({"n_ctx": 0}) is None
    assert lmstudio_window({"max_context_length": 32768}) == 32768
    ps = {"models": [{"name": "other", "context_length": 1}, {"name": "m", "context_length": 4096}]}
    assert ollama_ps_window(ps, "m") == 4096
    assert ollama_ps_window(ps, "absent") is None
    assert ollama_show_window({"parameters": "stop <eos>\nnum_ctx 8192\n",
                               "model_info": {"llama.context_length": 131072}}) == 8192
    assert ollama_show_window({"model_info": {"general.architecture": "qwen2",
                                              "qwen2.context_length": 32768}}) == 32768
    assert ollama_show_window({"model_info": {}}) is None


# --- the window from the start ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "routes", "budget"),
    [
        pytest.param({"max_model_len": 2048}, {}, 512, id="vllm"),
        pytest.param({"meta": {"n_ctx_train": 131072}},
                     {"props": {"default_generation_settings": {"n_ctx": 1024}}}, 256,
                     id="llama.cpp-props"),
        pytest.param({"meta": {"n_ctx_train": 3000}}, {}, 750, id="llama.cpp-trained"),
        pytest.param({}, {"api/v0/models/scripted": {"loaded_context_length": 1200,
                                                      "max_context_length": 32768}}, 300,
                     id="lm-studio"),
        pytest.param({}, {"api/ps": {"models": [{"name": "scripted", "context_length": 4000}]},
                          "api/show": {"model_info": {"llama.context_length": 131072}}}, 1000,
                     id="ollama-loaded"),
        pytest.param({}, {"api/show": {"model_info": {"llama.context_length": 131072}}}, 4096,
                     id="ollama-show"),
    ],
)
async def test_the_first_round_is_budgeted_from_what_the_server_says(
    config: Config, scripted: ScriptedOpenAI, fields: dict[str, Any], routes: dict[str, Any],
    budget: int,
) -> None:
    scripted.model_fields = fields
    scripted.root_routes = routes
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation()
        await run_turn(agent, conv, "hello")
        assert agent.model_error is None
    assert scripted.requests[0]["max_completion_tokens"] == budget


async def test_without_a_window_the_server_decides(config: Config, scripted: ScriptedOpenAI) -> None:
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation()
        await run_turn(agent, conv, "hello")
    assert "max_completion_tokens" not in scripted.requests[0]
    asked = [path for _, path in scripted.side_requests]
    assert asked == ["v1/models", "props", "api/v0/models/scripted", "api/ps", "api/show"]


async def test_answers_of_another_shape_are_no_window_and_no_crash(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    """Routes that answer JSON of another shape (a server that is none of these): no window,
    the server answers, the runtime runs on."""
    scripted.model_fields = {"meta": "x", "max_model_len": "2048"}
    scripted.root_routes = {"props": [1], "api/v0/models/scripted": {"loaded_context_length": -1},
                            "api/ps": {"models": 5}, "api/show": {"model_info": [], "parameters": 3}}
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation()
        await run_turn(agent, conv, "hello")
        assert agent.model_error is None
    assert "max_completion_tokens" not in scripted.requests[0]


async def test_a_configured_window_asks_only_whether_the_server_answers(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    scripted.model_fields = {"max_model_len": 100_000}
    async with open_runtime(config.replace(context_window=800)) as agent:
        conv = await agent.create_conversation()
        await run_turn(agent, conv, "hello")
    assert scripted.requests[0]["max_completion_tokens"] == 200
    assert scripted.side_requests == [("GET", "v1/models")]


# --- /readyz -----------------------------------------------------------------------------------


async def readiness(config: Config) -> tuple[int, dict[str, Any]]:
    async with serve_app(config) as srv, httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
        with trio.fail_after(10):
            answer = await http.get("/readyz")
    return answer.status_code, answer.json()


async def test_readyz_says_the_model_answers(config: Config, scripted: ScriptedOpenAI) -> None:
    status, body = await readiness(config)
    assert (status, body["status"], body["model_reachable"]) == (200, "ready", True), body


async def test_readyz_is_degraded_while_the_model_does_not_answer(config: Config) -> None:
    status, body = await readiness(config.replace(openai_base_url="http://127.0.0.1:9/v1"))
    assert (status, body["status"], body["model_reachable"]) == (200, "degraded", False), body
    assert body["storage"]["writable"] is True
    [reason] = body["reasons"]
    assert reason.startswith("the model does not answer: cannot reach the LLM endpoint "
                             "http://127.0.0.1:9/v1/"), reason


async def test_no_model_configured_is_said_at_start_up_and_on_readyz(
    db_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentik.runtime")
    status, body = await readiness(Config(db_path=db_path))
    warnings = [r.getMessage() for r in caplog.records if r.name == "agentik.runtime"]
    assert warnings == [NO_MODEL]
    assert "OPENAI_BASE_URL" in NO_MODEL and "agentik check" in NO_MODEL
    assert (status, body["status"], body["model_reachable"]) == (200, "degraded", False), body
    assert body["reasons"] == [f"the model does not answer: {NO_MODEL}"]
