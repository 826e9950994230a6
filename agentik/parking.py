"""Parking, for :class:`agentik.sse.WakeBody` (see :mod:`agentik.sse`): a body that has just
written events waits for the next ones with its task off the run queue, woken by its source
(``trio.lowlevel.reschedule``), for PARK to PARK_MAX seconds; this module ends the parks that ran
out. One :class:`Parking` per trio run (:func:`current_parking`)."""

from __future__ import annotations

from typing import Protocol

import trio


class Parked(Protocol):
    def unpark(self) -> None:
        """Reschedule the parked task (the park ran out)."""


#: seconds a stream that has just written events waits for the next ones *parked* (see
#: agentik.sse) before its idle wait; a park lasts PARK to PARK_MAX seconds
PARK = 1.0
PARK_MAX = 1.5 * PARK


class Parking:
    """The parked bodies of one trio run, in the order they parked (each with the time it
    parked), and the one task that ends the parks that ran out: a system task, started by the
    first park, that looks every PARK / 2 seconds while any body is parked."""

    def __init__(self) -> None:
        self.parked: dict[Parked, float] = {}
        self._started = False
        #: set by the next park while the task waits for one
        self._parked_again: trio.Event | None = None

    def park(self, body: Parked, now: float) -> None:
        self.parked[body] = now
        if self._parked_again is not None:
            self._parked_again.set()
            self._parked_again = None
        elif not self._started:
            self._started = True
            trio.lowlevel.spawn_system_task(self._end_parks, name="agentik.parking")

    async def _end_parks(self) -> None:
        while True:
            if not self.parked:
                self._parked_again = trio.Event()
                await self._parked_again.wait()
            await trio.sleep(PARK / 2)
            since = trio.current_time() - PARK
            over = []
            for body, parked_at in self.parked.items():  # oldest first
                if parked_at > since:
                    break
                over.append(body)
            for body in over:
                del self.parked[body]
                body.unpark()


_PARKING: trio.lowlevel.RunVar[Parking] = trio.lowlevel.RunVar("agentik.parking")


def current_parking() -> Parking:
    try:
        return _PARKING.get()
    except LookupError:
        parking = Parking()
        _PARKING.set(parking)
        return parking
