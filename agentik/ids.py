"""The ids agentik makes: conversations, messages (a user message's id is its turn's), A2A tasks
and contexts.

32 hex characters, like a UUID's hex, but time-ordered: the first 12 are the Unix time in
milliseconds, the other 20 random (80 bits, so ids made in the same millisecond still differ).
They are primary keys and unique-index keys of the stores (``message.id``, ``turn.id``,
``conversation.id``, ``a2a_task.id``): random keys land all over each B-tree, so every commit
dirties a page per row per index (and writes it to the WAL); ids that grow with time land at the
right edge, a few pages a commit. To a client they stay opaque strings (docs/PROTOCOL.md §2).
"""

from __future__ import annotations

import os
import time


def new_id() -> str:
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"
