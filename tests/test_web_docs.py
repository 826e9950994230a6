"""docs/PROTOCOL.md and /agentik/openapi.json tell the truth: the doc's shell examples run as
written against a real server, and the OpenAPI document lists exactly the app's routes."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from agentik.web.openapi import ROUTES
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    client,
    config,
    no_error_logs,
    openai,
    server,
)

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

PROTOCOL = Path(__file__).resolve().parent.parent / "docs" / "PROTOCOL.md"

# Streaming examples (curl -N) would run forever: cut them after a moment, which is a success.
PRELUDE = r"""
set -euo pipefail
curl() {
  local arg
  for arg in "$@"; do
    if [[ "$arg" == -[a-zA-Z]*N* ]]; then
      command curl --max-time 1 "$@" || [ $? -eq 28 ]
      return
    fi
  done
  command curl --fail-with-body "$@"
}
"""


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, flags=re.S)


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl, jq")
async def test_protocol_examples_run_as_written(server: Server) -> None:
    blocks = shell_blocks(PROTOCOL.read_text())
    assert len(blocks) >= 5
    script = PRELUDE + "\n".join(blocks)
    env = {"BASE": server.url, "PATH": "/usr/bin:/bin:/usr/local/bin"}
    with trio.fail_after(60):
        result = await trio.run_process(
            ["bash", "-c", script], env=env, capture_stdout=True, capture_stderr=True,
            check=False,
        )
    out = result.stdout.decode()
    assert result.returncode == 0, (out, result.stderr.decode())
    for expected in ('"name":"agentik"', '"title":"renamed"', '"message_id"', '"interrupted"',
                     "event: user_message", ": connected", '"count"', '"servers":[]'):
        assert expected in out, expected


def test_every_route_is_in_the_protocol_doc() -> None:
    text = PROTOCOL.read_text()
    for route in ROUTES:
        path = route.path.replace("{conversation_id}", "{id}")
        assert f"`{path}" in text, path


async def test_openapi_matches_the_routes(client: httpx2.AsyncClient, server: Server) -> None:
    response = await client.get("/agentik/openapi.json")
    assert response.status_code == 200
    doc: dict[str, Any] = response.json()
    assert doc["openapi"] == "3.1.0"

    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    served: set[tuple[str, str]] = set()
    for rule in server.app.url_map.iter_rules():
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
        methods = {"GET"} if rule.websocket else set(rule.methods or ()) - {"HEAD", "OPTIONS"}
        served |= {(method, path) for method in methods}
    assert documented == served

    # Every schema reference resolves.
    schemas = doc["components"]["schemas"]
    refs = re.findall(r'"\$ref":\s*"#/components/schemas/([^"]+)"', response.text)
    assert refs and all(ref in schemas for ref in refs)
    send = doc["paths"]["/agentik/conversations/{conversation_id}/messages"]["post"]
    assert set(send["responses"]) >= {"202", "400", "404", "413", "429"}
    assert doc["paths"]["/healthz"]["get"]["security"] == []
