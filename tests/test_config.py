"""Config.from_env: every variable of docs/CONFIG.md is read; a bad value names the variable."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agentik.config import Config
from agentik.errors import ConfigError


def test_defaults() -> None:
    cfg = Config.from_env({})
    assert cfg.port == 8080 and cfg.db_path == "./agentik.db" and cfg.llm_backend == "openai"
    assert cfg.tokens == () and cfg.sqlite_synchronous == "FULL"


#: every variable Config.from_env reads, each with a value other than its default
EVERY_VARIABLE = {
    "AGENTIK_PORT": "9000", "AGENTIK_DB_PATH": "/tmp/x.db", "AGENTIK_SYSTEM_PROMPT": "be brief",
    "AGENTIK_LLM_BACKEND": "LiteRT", "OPENAI_BASE_URL": "http://127.0.0.1:1/v1",
    "OPENAI_API_KEY": "k", "OPENAI_MODEL": "m", "AGENTIK_LLM_TIMEOUT": "7.5",
    "AGENTIK_LLM_MAX_RETRIES": "0", "AGENTIK_CONTEXT_WINDOW": "8192",
    "AGENTIK_LITERT_MODEL_PATH": "/m.litertlm", "AGENTIK_LITERT_THREADS": "4",
    "AGENTIK_LITERT_MAX_CONCURRENCY": "3", "AGENTIK_LITERT_MAX_OUTPUT_TOKENS": "256",
    "AGENTIK_MCP_CONFIG": "/mcp.json", "AGENTIK_AGENTS": "/agents.toml",
    "AGENTIK_TEMPERATURE": "0.5", "AGENTIK_TOKENS": "a, b,,c", "AGENTIK_OUTBOX_CAP": "10",
    "AGENTIK_OUTBOX_TTL": "60", "AGENTIK_IDLE_TIMEOUT": "1.5", "AGENTIK_MAILBOX_SIZE": "3",
    "AGENTIK_TOOL_TIMEOUT": "2.5", "AGENTIK_TOOL_RESULT_CAP": "1000",
    "AGENTIK_MAX_TOOL_ROUNDS": "4", "AGENTIK_SQLITE_SYNCHRONOUS": "normal",
    "AGENTIK_MAX_BATCH": "64", "AGENTIK_SUBSCRIBER_BUFFER": "128", "AGENTIK_RESTART_LIMIT": "9",
    "AGENTIK_RESTART_PERIOD": "30", "AGENTIK_MAX_BODY_BYTES": "2048",
    "AGENTIK_IMAGE_TYPES": "image/PNG, image/gif", "AGENTIK_MAX_IMAGE_BYTES": "4096",
    "AGENTIK_MAX_OUTPUT_TOKENS": "512", "AGENTIK_SUMMARY_MAX_TOKENS": "128",
    "AGENTIK_KEEP_ALIVE_TIMEOUT": "12.5", "AGENTIK_BACKLOG": "2048",
    "AGENTIK_AGENT_NAME": "helper",
    "AGENTIK_AGENT_DESCRIPTION": "answers questions",
    "AGENTIK_DATABASE_URL": "postgresql://u@h/db", "AGENTIK_NODE_ID": "n1",
    "AGENTIK_LEASE_TTL": "2.5", "AGENTIK_NODE_URL": "http://10.0.0.1:8080", "AGENTIK_GC_THRESHOLD": "1000",
    "AGENTIK_DB_TIMEOUT": "4.5",
    "AGENTIK_CORS_ORIGINS": "https://a.example/, http://b.example:3000",
    "AGENTIK_BUSY_POLICY": "Reject", "AGENTIK_IDEMPOTENCY_TTL": "60", "AGENTIK_LOG_FORMAT": "json",
    "AGENTIK_USERS": "/users.toml", "AGENTIK_JWT_JWKS": "https://issuer.example/jwks.json",
    "AGENTIK_JWT_ISSUER": "https://issuer.example", "AGENTIK_JWT_AUDIENCE": "agentik",
    "AGENTIK_JWT_ROLE_CLAIM": "realm_access.roles",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/v1/traces",
    "AGENTIK_TRACE_CONTENT": "1",
    "AGENTIK_APPROVAL": "toolbox__delete_*, x__*", "AGENTIK_APPROVAL_TIMEOUT": "300",
    "AGENTIK_ASK_USER": "1", "AGENTIK_WEBHOOKS": "/webhooks.toml",
    "AGENTIK_WEBHOOK_MAX_BACKOFF": "30", "AGENTIK_WEBHOOK_RETRY_FOR": "3600",
    "AGENTIK_PUSH_ALLOW_PRIVATE": "1",
}


class Recording(dict[str, str]):
    """An environment that remembers which variables were asked for."""

    def __init__(self, values: dict[str, str]) -> None:
        super().__init__(values)
        self.asked: list[str] = []

    def get(self, key: str, default: object = None) -> Any:
        self.asked.append(key)
        return super().get(key, default)


def test_reads_every_variable() -> None:
    env = Recording(EVERY_VARIABLE)
    cfg = Config.from_env(env)
    # the list above is complete: a variable added to from_env must be added here too
    assert set(env.asked) ^ set(EVERY_VARIABLE) == set()  # names read here or listed only
    assert len(env.asked) == len(EVERY_VARIABLE)  # each read once
    assert cfg.port == 9000 and cfg.db_path == "/tmp/x.db" and cfg.system_prompt == "be brief"
    assert cfg.llm_backend == "litert" and cfg.openai_base_url == "http://127.0.0.1:1/v1"
    assert (cfg.openai_api_key, cfg.openai_model) == ("k", "m")
    assert (cfg.llm_timeout, cfg.llm_max_retries, cfg.context_window) == (7.5, 0, 8192)
    assert cfg.litert_model_path == "/m.litertlm" and cfg.litert_threads == 4
    assert (cfg.litert_max_concurrency, cfg.litert_max_output_tokens) == (3, 256)
    assert cfg.agents_path == "/agents.toml" and cfg.temperature == 0.5
    assert cfg.mcp_config == "/mcp.json" and cfg.tokens == ("a", "b", "c")
    assert (cfg.outbox_cap, cfg.outbox_ttl, cfg.idle_timeout, cfg.mailbox_size) == (10, 60.0, 1.5, 3)
    assert (cfg.tool_timeout, cfg.tool_result_cap, cfg.max_tool_rounds) == (2.5, 1000, 4)
    assert cfg.sqlite_synchronous == "NORMAL" and cfg.db_timeout == 4.5
    assert (cfg.max_batch, cfg.subscriber_buffer) == (64, 128)
    assert (cfg.restart_limit, cfg.restart_period, cfg.max_body_bytes) == (9, 30.0, 2048)
    assert (cfg.max_output_tokens, cfg.summary_max_tokens) == (512, 128)
    assert cfg.keep_alive_timeout == 12.5 and cfg.backlog == 2048
    assert (cfg.image_types, cfg.max_image_bytes) == (("image/png", "image/gif"), 4096)
    assert (cfg.agent_name, cfg.agent_description) == ("helper", "answers questions")
    assert cfg.cors_origins == ("https://a.example", "http://b.example:3000")
    assert (cfg.busy_policy, cfg.idempotency_ttl, cfg.log_format) == ("reject", 60.0, "json")
    assert (cfg.database_url, cfg.node_id, cfg.lease_ttl, cfg.node_url) == (
        "postgresql://u@h/db", "n1", 2.5, "http://10.0.0.1:8080")
    assert cfg.gc_threshold == 1000
    # the traces' own endpoint wins over the collector's base URL
    assert (cfg.trace_endpoint, cfg.trace_content) == ("http://traces:4318/v1/traces", True)
    assert (cfg.approval_timeout, cfg.ask_user) == (300.0, True)
    assert (cfg.webhooks_file, cfg.webhook_max_backoff, cfg.webhook_retry_for) == (
        "/webhooks.toml", 30.0, 3600.0)
    assert cfg.push_allow_private
    assert (cfg.users_file, cfg.jwt_jwks, cfg.jwt_issuer, cfg.jwt_audience, cfg.jwt_role_claim) == (
        "/users.toml", "https://issuer.example/jwks.json", "https://issuer.example", "agentik",
        "realm_access.roles")
    # and each one landed: no field kept its default
    defaults = Config()
    unchanged = [f.name for f in dataclasses.fields(Config)
                 if getattr(cfg, f.name) == getattr(defaults, f.name)]
    assert unchanged == []


@pytest.mark.parametrize("variable,value", [
    ("AGENTIK_PORT", "eighty"), ("AGENTIK_PORT", "70000"), ("AGENTIK_LLM_BACKEND", "google"),
    ("OPENAI_BASE_URL", "localhost:8000"), ("AGENTIK_OUTBOX_CAP", "0"),
    ("AGENTIK_OUTBOX_TTL", "-1"), ("AGENTIK_IDLE_TIMEOUT", "soon"), ("AGENTIK_TOKENS", " , "),
    ("AGENTIK_SQLITE_SYNCHRONOUS", "SOMETIMES"), ("AGENTIK_MAILBOX_SIZE", "1.5"),
])
def test_bad_value_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_env({variable: value})
    assert info.value.variable == variable
    assert str(info.value).startswith(variable)
    # the value is shown, except a secret's (tests/test_config_sweep.py)
    assert (repr(value) in str(info.value)) is (variable != "AGENTIK_TOKENS")


def test_context_settings() -> None:
    cfg = Config.from_env({"AGENTIK_MAX_OUTPUT_TOKENS": "300", "AGENTIK_SUMMARY_MAX_TOKENS": "64",
                           "AGENTIK_LITERT_MAX_OUTPUT_TOKENS": "100"})
    assert (cfg.max_output_tokens, cfg.summary_max_tokens, cfg.litert_max_output_tokens) == (
        300, 64, 100)
    defaults = Config.from_env({})
    assert (defaults.context_window, defaults.max_output_tokens, defaults.summary_max_tokens,
            defaults.litert_max_output_tokens) == (0, 0, 0, 0)
    for variable in ("AGENTIK_MAX_OUTPUT_TOKENS", "AGENTIK_SUMMARY_MAX_TOKENS"):
        with pytest.raises(ConfigError, match=variable):
            Config.from_env({variable: "-5"})


def test_traces_go_to_the_collectors_v1_traces() -> None:
    """OTLP/HTTP's rule: OTEL_EXPORTER_OTLP_ENDPOINT is a base URL, its traces path appended."""
    for base in ("http://collector:4318", "http://collector:4318/"):
        cfg = Config.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": base})
        assert cfg.trace_endpoint == "http://collector:4318/v1/traces"
    assert Config.from_env({}).trace_endpoint is None
    with pytest.raises(ConfigError, match="AGENTIK_TRACE_CONTENT"):
        Config.from_env({"AGENTIK_TRACE_CONTENT": "yes"})
