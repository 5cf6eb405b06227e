"""When the scheduler had room for another prompt: the evidence by which a refusal is
judged needless (``slo.TtftOutcomes``).

The scheduler has room in a step when, after the batching strategy filled it, token
budget is left, nothing is waiting and the batch has a free slot: a request admitted
earlier would have had a prefill chunk in that step at no one's expense. It has room
while idle, too: from when the last request left (nothing running or waiting) until the
next is queued. Queueing ends idle room at once rather than at the next step, so
requests refused in a burst that reaches an idle server do not find the idle time before
the burst counted as room after their refusal.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

# Closed runs kept; a refusal is judged within its TTFT target (seconds), so only the
# last few runs are ever asked about.
MAX_RUNS = 1024


class RoomView(Protocol):
    """The read side of ``RoomLog``, for admission and ``slo.TtftOutcomes``."""

    def had_room(self, start: float, end: float) -> bool: ...


class RoomLog:
    """Runs of time with room, as ``(first, last)`` (seconds, the engine's clock): a run
    of consecutive steps with room spans their start times; an idle spell, from when
    the scheduler went idle to when the next request was queued. The scheduler calls
    ``on_step(now, room)`` once per planned step, ``on_idle(now)`` when its last request
    left and ``on_queued(now)`` when a request is queued; ``had_room(start, end)``
    answers whether a run overlaps ``[start, end]``. O(1) per call but ``had_room``, which
    looks back only as far as ``start``."""

    __slots__ = ("_idle", "_open", "_runs")

    def __init__(self) -> None:
        self._runs: deque[tuple[float, float]] = deque(maxlen=MAX_RUNS)
        # [first, last] of the run going on, else None; ``last`` is infinite while idle.
        # A new scheduler has been idle since before any time it will be asked about.
        self._open: list[float] | None = [-math.inf, math.inf]
        self._idle = True

    def on_step(self, now: float, room: bool) -> None:
        """A step starting at ``now`` was planned, with room (see the module) or not."""
        run = self._open
        if room:
            if run is None:
                self._open = [now, now]
            elif not self._idle:  # an idle spell already lasts until now
                run[1] = now
        elif run is not None:
            self._runs.append((run[0], now if self._idle else run[1]))
            self._open, self._idle = None, False

    def on_idle(self, now: float) -> None:
        """Nothing is running or waiting since ``now``."""
        if self._idle:
            return
        self._idle = True
        if self._open is None:
            self._open = [now, math.inf]
        else:
            self._open[1] = math.inf

    def on_queued(self, now: float) -> None:
        """A request was queued at ``now``: an idle spell ends (the next step says whether
        there is room again)."""
        if self._idle:
            assert self._open is not None  # an idle spell is always the open run
            self._runs.append((self._open[0], now))
            self._open, self._idle = None, False

    def had_room(self, start: float, end: float) -> bool:
        """Whether the scheduler had room at some moment from ``start`` to ``end`` (s),
        as far as what it has been told so far (an idle spell lasts until now: pass an
        ``end`` no later than now)."""
        if end < start:
            return False
        run = self._open
        if run is not None and run[0] <= end and run[1] >= start:
            return True
        for first, last in reversed(self._runs):
            if last < start:
                return False  # runs are in time order: every earlier one ends sooner
            if first <= end:
                return True
        return False
