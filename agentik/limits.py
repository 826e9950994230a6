"""Per-user limits as pure decisions (docs/USERS.md): the send-rate token bucket and the daily
token window. The clock is an argument (seconds since the epoch), so tests need no real time;
the web layer holds the buckets and passes ``time.time()``.

- Sends: a bucket holding ``sends_per_minute`` sends, refilled evenly over a minute. A send takes
  one; an empty bucket answers how long until the next send would fit (``Retry-After``).
- Tokens per day: prompt + completion tokens as the model reported them, counted per user and UTC
  day. A user at or over their limit is refused until the next UTC midnight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

MINUTE = 60.0


@dataclass
class SendBucket:
    """A token bucket of ``capacity`` sends refilled at ``capacity`` a minute. Starts full."""

    capacity: int
    level: float
    at: float

    @classmethod
    def full(cls, capacity: int, now: float) -> SendBucket:
        return cls(capacity=capacity, level=float(capacity), at=now)

    def take(self, now: float) -> float | None:
        """Take one send: None when it fits, else the seconds until it would (nothing taken)."""
        rate = self.capacity / MINUTE
        if now > self.at:
            self.level = min(float(self.capacity), self.level + (now - self.at) * rate)
            self.at = now
        if self.level >= 1.0:
            self.level -= 1.0
            return None
        return (1.0 - self.level) / rate


class SendRates:
    """The buckets of every user that has sent, by user id. A bucket whose capacity changed
    (another limit) starts again full."""

    def __init__(self) -> None:
        self._buckets: dict[str, SendBucket] = {}

    def take(self, user: str, per_minute: int | None, now: float) -> float | None:
        """One send of ``user``: None when allowed (or unlimited), else seconds to wait."""
        if per_minute is None:
            return None
        bucket = self._buckets.get(user)
        if bucket is None or bucket.capacity != per_minute:
            bucket = self._buckets[user] = SendBucket.full(per_minute, now)
        return bucket.take(now)


def utc_day(now: float) -> str:
    """The UTC day ``now`` falls in, ``YYYY-MM-DD`` (the key usage is counted under)."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")


def next_reset(now: float) -> float:
    """The next UTC midnight after ``now``, in seconds since the epoch."""
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (today + timedelta(days=1)).timestamp()


def tokens_retry_after(used: int, per_day: int | None, now: float) -> int | None:
    """None while ``used`` is under ``per_day`` (or no limit), else whole seconds until the
    reset (at least 1)."""
    if per_day is None or used < per_day:
        return None
    return max(1, math.ceil(next_reset(now) - now))


def retry_after_header(seconds: float) -> int:
    """Whole seconds for a ``Retry-After`` header, rounded up, at least 1."""
    return max(1, math.ceil(seconds))
