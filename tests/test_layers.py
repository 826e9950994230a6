"""The layers of docs/ARCHITECTURE.md, checked against the code's own imports.

Every module of ``agentik`` is parsed with ``ast``; every ``import`` counts, at module level or
inside a function, except those under ``if TYPE_CHECKING:`` (type checkers only). The root
package's lazy exports (``agentik._EXPORTS``, PEP 562) count as imports of the root. A module
belongs to the group of its package (the table below); a new module of a known package fits by
itself, a module outside every package of the picture fails the test until it is drawn.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import agentik

PACKAGE = Path(agentik.__file__).resolve().parent

#: group -> the modules in it: a name stands for that module and everything under it, except
#: the bare root ``agentik`` (the public façade), which stands for itself only
GROUPS: dict[str, tuple[str, ...]] = {
    # agentik.metrics: a leaf (prometheus-client only) every layer may update
    # agentik.api: what the in-process agent and the client share (content, conversation handle)
    # agentik.ids: the ids agentik makes (time-ordered), a leaf like metrics
    # agentik.content: what a message's content may hold (the image rules), pure
    # agentik.tracing: OpenTelemetry spans (optional extra), a leaf like metrics
    # agentik.webhook_types: the webhook routes' bodies, beside agentik.protocol
    "types": ("agentik.wire", "agentik.wire_base", "agentik.wire_pause", "agentik.errors",
              "agentik.protocol", "agentik.metrics", "agentik.api",
              "agentik.ids", "agentik.content", "agentik.tracing", "agentik.protocol_branches",
              "agentik.wire_branch", "agentik.webhook_types"),
    # agentik.users / agentik.limits: principals and per-user limits, pure like the config;
    # agentik.profiles: the agents file, parsed and checked (pure, beside the settings)
    "config": ("agentik.config", "agentik.config_values", "agentik.users", "agentik.limits",
               "agentik.profiles"),
    "context": ("agentik.context",),
    # agentik.storage: the shared core (ops, types, reads, hub, committer, health); its engines
    # below it, each with its own SQL; storage.actor opens one of them (the only module that
    # names both)
    "storage": ("agentik.storage",),
    "sqlite": ("agentik.storage.sqlite",),
    "pg": ("agentik.storage.pg",),
    "storage_actor": ("agentik.storage.actor",),
    "llm": ("agentik.llm",),
    "tools": ("agentik.tools",),
    "actors": ("agentik.actors",),
    "facade": (
        "agentik", "agentik.runtime", "agentik.agent", "agentik.agent_handles",
        "agentik.agent_users", "agentik.testing",
        "agentik.cluster", "agentik.agent_branches",
        # webhooks (docs/WEBHOOKS.md): the pure rules, the deliveries, agent.webhooks
        "agentik.webhooks", "agentik.webhook_delivery", "agentik.agent_webhooks",
    ),
    # agentik.sse: the SSE frame and bodies both front doors use (below web/ and a2a/);
    # agentik.parking: how its bodies wait between a live stream's tokens
    # agentik.openai_api: the OpenAI-compatible routes, a sibling of the A2A facade
    # agentik.turns: a turn's durable events as steps, read alike by a2a/ and openai_api/
    "front": ("agentik.web", "agentik.a2a", "agentik.openai_api", "agentik.sse", "agentik.parking",
              "agentik.turns"),
    "client": ("agentik.client",),
    "cli": ("agentik.cli", "agentik.__main__", "agentik.check"),
}

#: group -> the groups it may import (besides itself): the picture in docs/ARCHITECTURE.md
MAY_IMPORT: dict[str, set[str]] = {
    "types": set(),
    "config": {"types"},
    "context": {"types"},
    "storage": {"types", "config"},
    "sqlite": {"types", "config", "storage"},
    "pg": {"types", "config", "storage"},
    "storage_actor": {"types", "config", "storage", "sqlite", "pg"},
    "llm": {"types", "config", "context"},
    "tools": {"types", "config", "llm"},
    "actors": {"types", "config", "context", "storage", "storage_actor", "llm", "tools"},
    # (a cluster node forwards a command to the conversation's owner with the client)
    "facade": {"types", "config", "context", "storage", "storage_actor", "llm", "tools", "actors",
               "client"},
    # the web goes through the Agent API: no storage, no actors
    "front": {"types", "config", "llm", "tools", "facade"},
    # a client program loads the client, the wire and protocol types and the error tree only
    "client": {"types"},
    "cli": {"types", "config", "storage", "storage_actor", "llm", "tools", "actors", "facade",
            "front", "client"},
}



def module_names() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("agentik", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node``, skipping the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _imports_of(other)
            continue
        yield from _imports_of(child)


def _imports_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _imports(node)


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The agentik modules ``module`` imports (``from pkg import sub`` counts as ``pkg.sub``)."""
    out: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "agentik")
            continue
        base = node.module or ""
        if node.level:
            anchor = module.split(".") if is_package else module.split(".")[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        if base.split(".")[0] != "agentik":
            continue
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            out.add(sub if sub in modules else base)
    if module == "agentik":
        out.update(agentik._EXPORTS.values())
    out.discard(module)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def group_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for group, names in GROUPS.items():
        for name in names:
            if module == name or (name != "agentik" and module.startswith(name + ".")):
                if best is None or len(name) > best[0]:
                    best = (len(name), group)
    return None if best is None else best[1]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# --- tests ---------------------------------------------------------------------------------------


def test_every_module_is_in_the_picture() -> None:
    assert [m for m in import_graph() if group_of(m) is None] == []
    assert set(MAY_IMPORT) == set(GROUPS)


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_imports_follow_the_layers() -> None:
    broken = []
    for module, imported in sorted(import_graph().items()):
        group = group_of(module)
        assert group is not None
        for other in sorted(imported):
            other_group = group_of(other)
            if other_group == group or other_group in MAY_IMPORT[group]:
                continue
            broken.append(f"{module} ({group}) imports {other} ({other_group})")
    assert broken == []


def test_the_checker_sees_cycles_and_function_level_imports(tmp_path: Path) -> None:
    """The checker itself: a cycle through an import inside a function is found, one through an
    ``if TYPE_CHECKING:`` import is not."""
    a = tmp_path / "a.py"
    a.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import agentik.x\n"
        "def f():\n    from agentik.y import thing\n"
    )
    modules = {"agentik.x": a, "agentik.y": a}
    assert imports_of("agentik.x", a, modules) == {"agentik.y"}
    assert cycles({"p": {"q"}, "q": {"p"}, "r": {"p"}}) == [["p", "q"]]


#: what a client program must not load (besides the server's own packages, the server's libraries)
SERVER_PARTS = (
    "agentik.storage", "agentik.actors", "agentik.web", "agentik.llm", "agentik.tools",
    "agentik.a2a", "agentik.runtime", "agentik.agent", "agentik.cluster",
    "quart", "hypercorn", "openai", "mcp", "psycopg", "prometheus_client",
)

LIGHT_CLIENT = f"""
import sys
import agentik.client
parts = {SERVER_PARTS!r}
print(" ".join(sorted(m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in parts))))
"""


def test_importing_the_client_loads_no_server_part() -> None:
    result = subprocess.run(
        [sys.executable, "-c", LIGHT_CLIENT], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == []
    # The same check sees the server when it is loaded.
    loaded = subprocess.run(
        [sys.executable, "-c", "import agentik.web.app\n" + LIGHT_CLIENT],
        capture_output=True, text=True, check=True, timeout=60,
    )
    assert {"agentik.storage", "agentik.web", "quart"} <= set(loaded.stdout.split())


def test_the_root_package_is_lazy_with_the_same_names() -> None:
    assert set(agentik.__all__) == {*agentik._EXPORTS, "__version__"}
    for name in agentik.__all__:
        assert getattr(agentik, name) is not None
    assert agentik.Text.__module__ == "agentik.wire"
    # the errors a client of the busy policy and of Idempotency-Key catches (issue 11)
    assert agentik.BusyError.__module__ == agentik.IdempotencyKeyReusedError.__module__ == (
        "agentik.errors"
    )


# --- sizes: a module or a function one can hold in one's head (issue 10) --------------------------

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: the words a longer function says why with, in its docstring or in a comment above its first
#: statement, e.g. ``(Over 60 lines on purpose: ...)``
LONG_REASON = re.compile(r"over 60 lines", re.I)

#: known to be over while their split is under way (issue 10), as ``path`` or ``path:function``
#: with who is splitting it; none today. Remove an entry once it fits.
TOO_LONG_FOR_NOW: set[str] = set()


def _says_why_it_is_long(fn: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> bool:
    doc = ast.get_docstring(fn) or ""
    head = lines[fn.lineno - 1 : fn.body[0].lineno - 1]  # the signature and comments above the body
    comments = " ".join(line.split("#", 1)[1] for line in head if "#" in line)
    return bool(LONG_REASON.search(doc) or LONG_REASON.search(comments))


def size_problems(path: Path, name: str) -> list[str]:
    """What in the module at ``path`` (shown as ``name``) is over the sizes above."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    if len(lines) > MAX_MODULE_LINES:
        found.append(f"{name} ({len(lines)} lines)")
    for node in ast.walk(ast.parse(text, str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > MAX_FUNCTION_LINES and not _says_why_it_is_long(node, lines):
            found.append(f"{name}:{node.name} ({length} lines, no 'over 60 lines' reason)")
    return found


def test_no_module_over_400_lines_and_no_function_over_60_without_a_reason() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        problems += [p for p in size_problems(path, name) if p.split(" ")[0] not in TOO_LONG_FOR_NOW]
    assert problems == []


def test_the_size_check_sees_a_long_module_and_an_unexplained_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    long_fn = tmp_path / "long.py"
    long_fn.write_text(f"def f():\n{body}\n\ndef g():\n    '''Over 60 lines: why.'''\n{body}"
                       f"\n\ndef h():  # over 60 lines: why\n{body}")
    assert size_problems(long_fn, "long") == ["long:f (61 lines, no 'over 60 lines' reason)"]
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert size_problems(big, "big") == ["big (401 lines)"]
