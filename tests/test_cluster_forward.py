"""A command forwarded to an owner node that does not answer is a 503 (not_owner: try again once
another node has taken the conversation over), never a 500."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio

from agentik.cluster import Peers
from agentik.config import Config
from agentik.errors import NotOwnerError, http_status


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_a_dead_owner_is_a_503_not_a_500(tmp_path: Path) -> None:
    peers = Peers(Config(db_path=str(tmp_path / "a.db")))
    dead = NotOwnerError("owned by n2", node_id="n2", addr=f"http://127.0.0.1:{closed_port()}")
    try:
        with trio.fail_after(30), pytest.raises(NotOwnerError) as info:
            await peers.forward(dead, lambda owner: owner.create_conversation())
    finally:
        await peers.aclose()
    assert info.value.addr == dead.addr and "does not answer" in str(info.value)
    assert http_status(info.value) == 503
