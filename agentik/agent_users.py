"""Users in the Agent API (docs/USERS.md): whose each conversation is, the streams filtered to a
user's own, and the limits checked before a send or a create. ``LocalAgent.users``.

The rules, each kept here once:

- A conversation's user is who created it (stored with it, kept after its deletion so a replay
  knows whose its events were). ``user=None`` everywhere means "every conversation": admins and
  in-process callers.
- Another user's conversation is answered exactly as an unknown one (:meth:`UserScope.require`
  raises the same NotFoundError after the same one read).
- A user's stream keeps only the events of their own conversations; events of no conversation
  (none today but A2A tasks without one) are for admins. Cursors stay global: a filtered stream
  skips the others' offsets, so resuming and 410 work as on the whole stream.
- Limits: sends a minute (a token bucket in this process: each node counts its own), turns
  accepted and not ended, conversations kept, model tokens a UTC day (stored per user, on both
  engines). Over one: RateLimitedError (429), with Retry-After when a wait is known.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from agentik.errors import NotFoundError, RateLimitedError
from agentik.limits import SendRates, next_reset, tokens_retry_after, utc_day
from agentik.storage.types import StoredEvent
from agentik.users import Limits

if TYPE_CHECKING:
    from agentik.storage.actor import Storage

#: conversation ids whose user is remembered before the memory is dropped and read again
MAX_REMEMBERED = 100_000
#: the Retry-After of a user at their turns at once (a turn may end any moment) and at their
#: conversations kept (nothing changes until they delete one: no point asking sooner)
TURN_WAIT = 1.0
DELETE_WAIT = 60.0


class UserScope:
    """Conversation -> user (read once, remembered: it never changes), and the limit checks."""

    def __init__(self, storage: Storage) -> None:
        self._reader = storage.reader
        self._users: dict[str, str] = {}
        self.rates = SendRates()

    async def users_of(self, conversation_ids: set[str]) -> dict[str, str]:
        """conversation id -> its user (those with none are left out)."""
        known = self._users
        missing = [cid for cid in conversation_ids if cid not in known]
        if missing:
            found = await self._reader.users_of(missing)
            if len(known) + len(found) > MAX_REMEMBERED:
                known.clear()
            known.update(found)
        return {cid: known[cid] for cid in conversation_ids if cid in known}

    async def owns(self, conversation_id: str, user: str | None) -> bool:
        """Whether ``user`` may reach the conversation (None: anyone may). One read (or none)
        whether it is unknown or another user's."""
        if user is None:
            return True
        return (await self.users_of({conversation_id})).get(conversation_id) == user

    async def require(self, conversation_id: str, user: str | None) -> None:
        """Raises NotFoundError, worded as for an unknown id, unless ``user`` may reach it."""
        if not await self.owns(conversation_id, user):
            raise NotFoundError(f"conversation {conversation_id!r} not found")

    async def filtered(
        self, batches: AsyncGenerator[list[StoredEvent], None], user: str | None
    ) -> AsyncGenerator[list[StoredEvent], None]:
        """``batches`` with only ``user``'s events. The first step steps ``batches`` before any
        checkpoint of its own (a hub stream subscribes there). An empty batch from ``batches``
        (nothing queued now) is passed on; a batch that is all others' is skipped, so a replay
        reads on instead of waiting."""
        try:
            async for batch in batches:
                if not batch or user is None:
                    yield batch
                    continue
                users = await self.users_of(
                    {ev.conversation_id for ev in batch if ev.conversation_id is not None})
                kept = [ev for ev in batch
                        if ev.conversation_id is not None and users.get(ev.conversation_id) == user]
                if kept:
                    yield kept
        finally:
            await batches.aclose()

    # --- limits ----------------------------------------------------------------------------------

    async def before_send(self, user: str, limits: Limits, now: float | None = None) -> None:
        """Take one send of ``user``'s bucket and check their turns and tokens. Raises
        RateLimitedError (nothing taken from the bucket when the turns or tokens refuse)."""
        now = time.time() if now is None else now
        turns = tokens = 0
        if limits.turns_at_once is not None or limits.tokens_per_day is not None:
            _, turns, tokens = await self._standing(user, now)
        wait = tokens_retry_after(tokens, limits.tokens_per_day, now)
        if wait is not None:
            raise RateLimitedError(
                f"{user} used {tokens} of {limits.tokens_per_day} model tokens today "
                "(UTC); the count starts again at midnight UTC", retry_after=wait)
        if limits.turns_at_once is not None and turns >= limits.turns_at_once:
            raise RateLimitedError(
                f"{user} has {turns} turns accepted and not ended, the most allowed at once",
                retry_after=TURN_WAIT)
        wait_send = self.rates.take(user, limits.sends_per_minute, now)
        if wait_send is not None:
            raise RateLimitedError(
                f"{user} is over {limits.sends_per_minute} sends a minute", retry_after=wait_send)

    async def before_create(self, user: str, limits: Limits, now: float | None = None) -> None:
        """Raises RateLimitedError when ``user`` keeps as many conversations as allowed."""
        if limits.conversations is None:
            return
        conversations, _, _ = await self._standing(user, time.time() if now is None else now)
        if conversations >= limits.conversations:
            raise RateLimitedError(
                f"{user} keeps {conversations} conversations, the most allowed: delete one first",
                retry_after=DELETE_WAIT)

    async def tokens_today(self, user: str, now: float | None = None) -> tuple[int, float]:
        """(model tokens ``user`` used this UTC day, when the count starts again)."""
        now = time.time() if now is None else now
        _, _, tokens = await self._reader.user_standing(user, utc_day(now))
        return tokens, next_reset(now)

    async def _standing(self, user: str, now: float) -> tuple[int, int, int]:
        return await self._reader.user_standing(user, utc_day(now))
