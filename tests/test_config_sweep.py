"""The settings sweep (issue 26, point 4): for every variable Config.from_env reads, bad values are
refused with one line naming the variable (pure parser tests over every setting), and a real
``agentik serve`` and plain hypercorn (one worker, two, or in its own process) exit non-zero
with that one line and nothing else."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from agentik.config import Config
from agentik.config_values import INT_MAX
from agentik.errors import ConfigError
from tests.test_web_lifespan import env_for, spawn

NOT_ASCII_DIGITS = ["\uff11\uff10", "٣", "²"]
INT_SYNTAX = [*NOT_ASCII_DIGITS, "10.0", "1e3", "-1", "+5", "0x10", "1_000", "ten", " ", "9" * 5000]
INT_BAD = [*INT_SYNTAX, str(INT_MAX + 1), "99999999999999999999999"]
POSITIVE_INT_BAD = [*INT_BAD, "0", "000"]
SECONDS_BAD = ["inf", "-inf", "nan", "infinity", "1e400", "1e-300", "0", "0.0001", "-1", "1,5",
               "5s", "0x10", "\uff11", "1_0", "31536001", "1e10", " "]
LINE_BAD = ["   ", "\t", "a\nb", "a\x1bb", "a\x7fb"]
TOKEN_BAD = ["a b", "tök", "a\tb", "k\x01", "\x7f", "ﬃ"]
URL_BAD = ["http://", "https://", "http:///path", "localhost:8000", "ftp://x", "http://h:99999",
           "http://h:port", "http://h ost", "http://hôst", "//h", "http:h"]
TEXT = None  # any text is a value (a path, a prompt: checked when used, not parsed)

#: every variable and its bad values (TEXT: no value is malformed). A variable read by
#: Config.from_env without its row here fails test_the_sweep_covers_every_setting.
SWEEP: dict[str, list[str] | None] = {
    "AGENTIK_PORT": [*INT_SYNTAX, "65536", "70000", "99999999999999999999999"],
    "AGENTIK_BACKLOG": [*INT_SYNTAX, "0", "65536", "99999999999999999999999"],
    "AGENTIK_DB_PATH": TEXT, "AGENTIK_SYSTEM_PROMPT": TEXT, "AGENTIK_MCP_CONFIG": TEXT,
    "AGENTIK_LITERT_MODEL_PATH": TEXT, "AGENTIK_USERS": TEXT, "AGENTIK_JWT_JWKS": TEXT,
    "AGENTIK_JWT_ISSUER": TEXT, "AGENTIK_JWT_AUDIENCE": TEXT, "AGENTIK_AGENTS": TEXT,
    "AGENTIK_TEMPERATURE": ["inf", "nan", "-0.1", "2.01", "1e400", "\uff11", "0x1", "hot", " "],
    "AGENTIK_LLM_BACKEND": ["google", "  ", "openai,litert"],
    "AGENTIK_SQLITE_SYNCHRONOUS": ["SOMETIMES", " "], "AGENTIK_BUSY_POLICY": ["wait", " "],
    "AGENTIK_LOG_FORMAT": ["xml", " "],
    "OPENAI_BASE_URL": URL_BAD, "AGENTIK_NODE_URL": URL_BAD,
    "OTEL_EXPORTER_OTLP_ENDPOINT": URL_BAD, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": URL_BAD,
    "AGENTIK_TRACE_CONTENT": ["yes", "true", "2", "on", " "],
    "AGENTIK_ASK_USER": ["yes", "true", "2", "on", " "],
    "AGENTIK_PUSH_ALLOW_PRIVATE": ["yes", "true", "2", "on", " "], "AGENTIK_WEBHOOKS": TEXT,
    "AGENTIK_APPROVAL": [" ", " , ", "toolbox__*,a\x01b", "a\u2028b"],
    "AGENTIK_APPROVAL_TIMEOUT": [b for b in SECONDS_BAD if b != "0"],
    "OPENAI_API_KEY": TOKEN_BAD, "AGENTIK_TOKENS": [*TOKEN_BAD, " , ", "good,bad one"],
    "OPENAI_MODEL": LINE_BAD, "AGENTIK_AGENT_NAME": LINE_BAD, "AGENTIK_AGENT_DESCRIPTION": LINE_BAD,
    "AGENTIK_NODE_ID": LINE_BAD, "AGENTIK_JWT_ROLE_CLAIM": LINE_BAD,
    "AGENTIK_CORS_ORIGINS": [
        "*,https://a.example", "https://a.example,*", "https://a.example/path",
        "https://a.example?x=1", "https://a.example#f", "https://user@a.example", "a.example",
        "https://", "https://a.example:70000", "null", " , ", "https://a.example, ftp://b"],
    "AGENTIK_IMAGE_TYPES": ["image/svg+xml", "image/png,text/html", " , ", "image/png\r\nX: y"],
    "AGENTIK_DATABASE_URL": ["mysql://x", "postgresql://h/d\x01b", "sqlite:///x.db"],
    "AGENTIK_DB_TIMEOUT": [*SECONDS_BAD, "2073601"],
    **{name: SECONDS_BAD for name in (
        "AGENTIK_LLM_TIMEOUT", "AGENTIK_OUTBOX_TTL", "AGENTIK_IDLE_TIMEOUT",
        "AGENTIK_TOOL_TIMEOUT", "AGENTIK_RESTART_PERIOD", "AGENTIK_KEEP_ALIVE_TIMEOUT",
        "AGENTIK_IDEMPOTENCY_TTL", "AGENTIK_LEASE_TTL", "AGENTIK_WEBHOOK_MAX_BACKOFF",
        "AGENTIK_WEBHOOK_RETRY_FOR")},
    **{name: INT_BAD for name in (
        "AGENTIK_LLM_MAX_RETRIES", "AGENTIK_CONTEXT_WINDOW", "AGENTIK_LITERT_MAX_OUTPUT_TOKENS",
        "AGENTIK_MAX_OUTPUT_TOKENS", "AGENTIK_SUMMARY_MAX_TOKENS", "AGENTIK_GC_THRESHOLD")},
    **{name: POSITIVE_INT_BAD for name in (
        "AGENTIK_LITERT_THREADS", "AGENTIK_LITERT_MAX_CONCURRENCY", "AGENTIK_OUTBOX_CAP",
        "AGENTIK_MAILBOX_SIZE", "AGENTIK_TOOL_RESULT_CAP", "AGENTIK_MAX_TOOL_ROUNDS",
        "AGENTIK_MAX_BATCH", "AGENTIK_SUBSCRIBER_BUFFER", "AGENTIK_RESTART_LIMIT",
        "AGENTIK_MAX_BODY_BYTES", "AGENTIK_MAX_IMAGE_BYTES")},
}
SECRETS = {"OPENAI_API_KEY", "AGENTIK_TOKENS", "AGENTIK_DATABASE_URL"}

#: values at the edges of each rule, accepted
GOOD: list[tuple[str, str, Any]] = [
    ("AGENTIK_PORT", "0", 0), ("AGENTIK_PORT", "65535", 65535), ("AGENTIK_PORT", " 8081 ", 8081),
    ("AGENTIK_BACKLOG", "65535", 65535), ("AGENTIK_MAX_BATCH", str(INT_MAX), INT_MAX),
    ("AGENTIK_GC_THRESHOLD", "0", 0), ("AGENTIK_MAILBOX_SIZE", "007", 7),
    ("AGENTIK_LLM_TIMEOUT", "0.001", 0.001), ("AGENTIK_OUTBOX_TTL", "31536000", 31536000.0),
    ("AGENTIK_IDLE_TIMEOUT", "1e3", 1000.0), ("AGENTIK_TOOL_TIMEOUT", ".5", 0.5),
    ("AGENTIK_DB_TIMEOUT", "2073600", 2073600.0),
    ("AGENTIK_TEMPERATURE", "0", 0.0), ("AGENTIK_TEMPERATURE", "2", 2.0),
    ("AGENTIK_TEMPERATURE", ".7", 0.7),
    ("AGENTIK_TOKENS", "a-B_c.9~!, x", ("a-B_c.9~!", "x")), ("OPENAI_API_KEY", "sk-1", "sk-1"),
    ("OPENAI_MODEL", " gpt-4o ", "gpt-4o"), ("AGENTIK_AGENT_NAME", "Hélène's agent", "Hélène's agent"),
    ("AGENTIK_CORS_ORIGINS", "*", ("*",)),
    ("AGENTIK_CORS_ORIGINS", "https://a.example/, http://[::1]:3000, http://b.example:8080",
     ("https://a.example", "http://[::1]:3000", "http://b.example:8080")),
    ("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1", "http://127.0.0.1:11434/v1"),
    ("AGENTIK_NODE_URL", "HTTPS://node-1.internal", "HTTPS://node-1.internal"),
    ("AGENTIK_APPROVAL", " Always ", "always"), ("AGENTIK_APPROVAL", "never", "never"),
    ("AGENTIK_APPROVAL", "toolbox__delete_*, *__send", ("toolbox__delete_*", "*__send")),
    ("AGENTIK_APPROVAL_TIMEOUT", "0", 0.0), ("AGENTIK_APPROVAL_TIMEOUT", "0.0", 0.0),
    ("AGENTIK_APPROVAL_TIMEOUT", "300", 300.0), ("AGENTIK_ASK_USER", "1", True),
]


class Asked(dict[str, str]):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def get(self, key: str, default: object = None) -> Any:
        self.asked.append(key)
        return default


def test_the_sweep_covers_every_setting() -> None:
    env = Asked()
    Config.from_env(env)
    assert sorted(env.asked) == sorted(SWEEP), "add the new variables to SWEEP"


@pytest.mark.parametrize("variable", sorted(name for name, bad in SWEEP.items() if bad))
def test_every_bad_value_is_one_line_naming_the_variable(variable: str) -> None:
    bad = SWEEP[variable]
    assert bad
    for value in bad:
        with pytest.raises(ConfigError) as caught:
            Config.from_env({variable: value})
            pytest.fail(f"{variable}={value!r} was accepted")
        message = str(caught.value)
        assert caught.value.variable == variable
        assert message.startswith(f"{variable}: invalid value ") and "\n" not in message, message
        assert message.isprintable() and len(message) < 400, message
        if variable in SECRETS:
            assert value.strip() not in message, message
            assert "not shown" in message


@pytest.mark.parametrize(("variable", "value", "expected"), GOOD)
def test_values_at_the_edges_are_accepted(variable: str, value: str, expected: Any) -> None:
    config = Config.from_env({variable: value})
    field = {"AGENTIK_TOKENS": "tokens", "OPENAI_API_KEY": "openai_api_key",
             "OPENAI_MODEL": "openai_model", "OPENAI_BASE_URL": "openai_base_url"}.get(
        variable, variable.removeprefix("AGENTIK_").lower())
    assert getattr(config, field) == expected


# --- real processes ------------------------------------------------------------------------------

SERVE = [sys.executable, "-m", "agentik.cli", "serve", "--port", "0"]


def hypercorn(workers: str) -> list[str]:
    return [sys.executable, "-m", "hypercorn", "-k", "trio", "-w", workers, "--bind",
            "127.0.0.1:0", "agentik.web:app"]


async def one_line(tmp_path: Path, args: list[str], variable: str, value: str) -> int:
    """Run ``args`` with ``variable=value`` until every process of it ends; return its exit
    status after checking it printed one line naming the variable, and nothing else."""
    async with spawn(args, env_for(tmp_path, **{variable: value}), tmp_path) as p:
        with trio.fail_after(60):
            code = await p.exit_code()
    lines = [line for line in p.output.splitlines() if line.strip()]
    assert len(lines) == 1, p.output  # once, whatever the number of workers; no traceback
    assert f"{variable}: invalid value" in lines[0], p.output
    return code


@pytest.mark.parametrize(("variable", "value"), [
    ("AGENTIK_BACKLOG", "99999999999999999999999"), ("AGENTIK_DB_TIMEOUT", "inf"),
    ("AGENTIK_GC_THRESHOLD", "9" * 30), ("AGENTIK_PORT", "\uff11\uff10"), ("OPENAI_MODEL", " "),
])
async def test_agentik_serve_exits_2_with_one_line(
    tmp_path: Path, variable: str, value: str
) -> None:
    assert await one_line(tmp_path, SERVE, variable, value) == 2


@pytest.mark.parametrize("workers", ["0", "1", "2"])
async def test_hypercorn_exits_non_zero_with_one_line(tmp_path: Path, workers: str) -> None:
    code = await one_line(tmp_path, hypercorn(workers), "AGENTIK_DB_TIMEOUT", "1e400")
    # -w 0: the app runs in hypercorn's process (exit 2, as agentik serve); with workers, the
    # reporting worker ends hypercorn's supervisor (agentik.web.process.terminate).
    assert code == (2 if workers == "0" else -signal.SIGKILL)


async def test_two_workers_report_a_bad_setting_once(tmp_path: Path) -> None:
    # Both workers fail on the same setting at about the same time: run it a few times.
    for _ in range(3):
        await one_line(tmp_path, hypercorn("2"), "AGENTIK_CORS_ORIGINS", "https://a.example/x")


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("AGENTIK_PORT", "\uff11\uff10", "must be an integer in ASCII digits"),
    ("AGENTIK_URL", "http://", "must name a host"),
    ("AGENTIK_URL", "http://h:99999", "bad port"),
    ("AGENTIK_TOKEN", "a secret with spaces", "must be printable ASCII without spaces"),
])
async def test_agentik_chat_reads_its_settings_by_the_same_rules(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    chat = [sys.executable, "-m", "agentik.cli", "chat"]
    async with spawn(chat, env_for(tmp_path, **{variable: value}), tmp_path) as p:
        with trio.fail_after(60):
            assert await p.exit_code() == 2, p.output
    lines = [line for line in p.output.splitlines() if line.strip()]
    assert len(lines) == 1 and variable in lines[0] and expected in lines[0], p.output
    if variable == "AGENTIK_TOKEN":
        assert value not in p.output
