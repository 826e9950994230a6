"""The journal's record of a change of branch (docs/PROTOCOL.md "Branches"): a member of
:data:`agentik.wire.Message` (defined here to keep :mod:`agentik.wire` within its size; import it
from there), stored with its ``branch_changed`` event. The tree of versions is read from these
records and the turns the others name (``actors/branches.py``)."""

from __future__ import annotations

from typing import Literal

from agentik.wire_base import Tagged


class BranchPoint(Tagged, frozen=True, kw_only=True):
    """``edit``: the user message journaled next is a new version of ``message_id``;
    ``regenerate``: a new answer to the user message ``message_id`` (this record's id is the new
    turn's); ``switch``: the version ``message_id`` became current."""

    kind: Literal["edit", "regenerate", "switch"]
    message_id: str
