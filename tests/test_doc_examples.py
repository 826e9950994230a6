"""Every ```python block of README.md and docs/*.md is a whole program that runs as pasted.

Each block is written to a file and run by a fresh interpreter (bounded in time) against a real
server started here: hypercorn on 127.0.0.1 port 0 serving the app, with the scripted
OpenAI-compatible model (``tests/scripted_openai.py``) as its LLM. The programs get the
environment the docs tell a reader to set: ``AGENTIK_URL`` (the server), and for in-process
programs ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` (the model) and ``AGENTIK_DB_PATH`` (their own
database, in the working directory). A block must end by itself (an example that follows a
stream stops after the turn's last event) and print something.

- The docs say the client library works under asyncio: the blocks of docs/CLIENT.md, and any
  other that uses the client library alone, run a second time with ``trio.run(main)`` replaced
  by ``asyncio.run(main())``.
- README.md's blocks must run on the bare install (``pip install -e .``, no extras): they run
  a second time with the extras' modules made unimportable.
- No doc names a file outside the repo (``../shared``, this machine's ``/work/``), "SPEC" or
  "the seeds".
- The sample ``mcp.json`` of docs/TOOLS.md parses, and its Python server gives the model the
  tool names the doc says.
"""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import os
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from agentik.config import Config
from agentik.tools.config import StdioServerConfig, parse_mcp_config
from agentik.tools.mcp import run_mcp_registry
from tests.scripted_openai import ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    make_config,
    no_error_logs,
    openai,
    serve_app,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: docs that say their examples work under asyncio too
ASYNCIO_DOCS = {"docs/CLIENT.md"}
#: docs whose examples must run on the bare install
BARE_DOCS = {"README.md"}
#: top-level modules that only an extra (or the test extra) installs
EXTRA_MODULES = ("psycopg", "psycopg_pool", "litert_lm", "playwright", "a2a", "pytest",
                 "hypothesis", "schemathesis", "opentelemetry")

#: runs a block as __main__ with the extras' modules unimportable, as on the bare install
BARE_RUNNER = f"""
import importlib.abc, runpy, sys
EXTRAS = {EXTRA_MODULES!r}
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in EXTRAS:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in the bare install)",
                                      name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

#: a block and the test around it stay under the suite's per-test timeout
TIMEOUT = 45


@dataclass(frozen=True)
class Block:
    doc: str  # relative to the repo root
    line: int
    code: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    doc = str(path.relative_to(ROOT))
    return [Block(doc, text.count("\n", 0, m.start()) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M)]


def runs_under_asyncio(block: Block) -> bool:
    """The docs say the client library works under asyncio: CLIENT.md's examples, and any other
    that uses the client library alone (not the trio-only server runtime)."""
    client_only = "from agentik.client import" in block.code and "open_runtime" not in block.code
    return block.doc in ASYNCIO_DOCS or client_only


BLOCKS = [block for path in DOCS for block in python_blocks(path)]
RUNS = [
    *(pytest.param(b, "trio", id=b.id) for b in BLOCKS),
    *(pytest.param(b, "asyncio", id=b.id + "-asyncio") for b in BLOCKS if runs_under_asyncio(b)),
    *(pytest.param(b, "bare", id=b.id + "-bare") for b in BLOCKS if b.doc in BARE_DOCS),
]


def is_mcp_server(block: Block) -> bool:
    return 'server.run("stdio")' in block.code


def as_asyncio(code: str) -> str:
    """The block with its last line ``trio.run(main)`` made ``asyncio.run(main())``."""
    assert code.rstrip().endswith("\ntrio.run(main)"), "a client example ends with trio.run(main)"
    return code.rstrip().removesuffix("trio.run(main)") + "import asyncio\nasyncio.run(main())\n"


@pytest.fixture
async def doc_server(tmp_path: Path, openai: ScriptedOpenAI) -> AsyncIterator[Server]:
    async with serve_app(make_config(tmp_path, openai)) as served:
        yield served


def test_every_doc_with_code_has_its_blocks_found() -> None:
    docs = {b.doc for b in BLOCKS}
    assert {"README.md", "docs/CLIENT.md", "docs/PROTOCOL.md", "docs/A2A.md"} <= docs, docs
    assert len(BLOCKS) >= 8


@pytest.mark.parametrize(("block", "loop"), RUNS)
async def test_python_block_runs_as_pasted(
    block: Block, loop: str, doc_server: Server, openai: ScriptedOpenAI, tmp_path: Path
) -> None:
    work = tmp_path / "reader"
    work.mkdir()
    program = work / "example.py"
    program.write_text(as_asyncio(block.code) if loop == "asyncio" else block.code)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(work),
        "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT)),
        "AGENTIK_URL": doc_server.url,
        "OPENAI_BASE_URL": openai.base_url,
        "OPENAI_API_KEY": "x",
        "AGENTIK_DB_PATH": str(work / "agentik.db"),
    }
    argv = [sys.executable, str(program)]
    if loop == "bare":
        argv = [sys.executable, "-c", BARE_RUNNER, str(program)]
    with trio.fail_after(TIMEOUT):
        result = await trio.run_process(argv, cwd=work, env=env, capture_stdout=True,
                                        capture_stderr=True, check=False, stdin=b"")
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, f"{block.id} failed:\n{out}\n{err}"
    if not is_mcp_server(block):  # a stdio MCP server only answers a client on stdin
        assert out.strip(), f"{block.id} printed nothing:\n{err}"


def test_no_doc_names_a_file_outside_the_repo() -> None:
    for path in DOCS:
        text = path.read_text()
        for word in ("../shared", "SPEC", "seeds", "/work/"):
            assert word not in text, f"{path.relative_to(ROOT)} names {word!r}"


def _json_after(text: str, marker: str) -> str:
    match = re.search(re.escape(marker) + r".*?```json\n(.*?)```", text, flags=re.S)
    assert match is not None, marker
    return match.group(1)


async def test_tools_doc_sample_config_and_names(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "TOOLS.md").read_text()
    servers = parse_mcp_config(_json_after(text, "<!-- sample mcp.json -->"), "the sample")
    assert list(servers) == ["files", "calc", "search"]
    calc = servers["calc"]
    assert isinstance(calc, StdioServerConfig)
    # The doc's calc server, started as the sample says, gives the model calc__add.
    (server_block,) = [b for b in python_blocks(ROOT / "docs" / "TOOLS.md")
                       if "MCPServer" in b.code]
    (tmp_path / calc.args[0]).write_text(server_block.code)
    only_calc = f'{{"mcpServers": {{"calc": {{"command": "{sys.executable}", ' \
                f'"args": ["{tmp_path / calc.args[0]}"]}}}}}}'
    (tmp_path / "mcp.json").write_text(only_calc)
    config = Config(db_path=str(tmp_path / "db"), mcp_config=str(tmp_path / "mcp.json"))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            registry = await nursery.start(run_mcp_registry, config)
            await registry.wait_until(lambda: bool(registry.specs()))
            names = sorted(spec.name for spec in registry.specs())
            nursery.cancel_scope.cancel()
    assert names == ["calc__add", "calc__multiply"]
    for name in names:
        assert f"`{name}`" in text
