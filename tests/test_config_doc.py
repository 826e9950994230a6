"""docs/CONFIG.md lists every variable agentik/config.py reads (issue 14), with type, default and
meaning: a variable added to Config.from_env without its row fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agentik.config import Config

CONFIG_MD = Path(__file__).resolve().parent.parent / "docs" / "CONFIG.md"


class Asked(dict[str, str]):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def get(self, key: str, default: object = None) -> Any:
        self.asked.append(key)
        return default


def documented_rows() -> dict[str, list[str]]:
    """variable -> its row's cells, for each table row that starts with a `VARIABLE`."""
    rows: dict[str, list[str]] = {}
    for line in CONFIG_MD.read_text().splitlines():
        m = re.match(r"\|\s*`([A-Z][A-Z0-9_]+)`\s*\|", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in line.strip().strip("|").split("|")]
    return rows


def test_every_variable_has_its_row() -> None:
    env = Asked()
    Config.from_env(env)
    assert env.asked, "Config.from_env read nothing?"
    rows = documented_rows()
    missing = [name for name in env.asked if name not in rows]
    assert missing == [], f"add these to docs/CONFIG.md: {missing}"
    for name in env.asked:
        _, kind, default, meaning = rows[name]
        assert kind and default and len(meaning) > 10, (name, rows[name])
    # and no row for a variable that is not read
    assert set(rows) - set(env.asked) == set()
