"""Clocks: wall time for serving, virtual time for simulation. Both count seconds."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Current time in seconds; only differences are meaningful."""
        ...


class WallClock:
    """Monotonic wall time."""

    def now(self) -> float:
        return time.monotonic()


class VirtualClock:
    """Time that moves only when told to; the simulator advances it by predicted step times."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"virtual time cannot go back ({t} < {self._now})")
        self._now = t
