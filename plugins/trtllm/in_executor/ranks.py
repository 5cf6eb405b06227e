"""Tensor parallel: rank 0 decides, every other rank follows.

Every tensor-parallel rank runs the same iteration and must schedule the same requests
with the same chunk sizes. Our core keeps state across iterations (waiting order, aging,
preemption counts, the online step-time fit, wall-clock readings), so identical inputs
would not give identical decisions on every rank; so only rank 0 runs the core and the
others apply its ``Decision``, sent by request id as TensorRT-LLM's own
``SerializableSchedulerOutput`` does (``tensorrt_llm/_torch/pyexecutor/scheduler.py`` at
``034fffb0``: ``LlmRequest`` is not picklable, so ids travel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Decision:
    """One iteration's schedule by TensorRT-LLM request id: ``context`` pairs each
    context request with its chunk size (tokens), in order; ``generation`` and
    ``paused`` list ids."""

    context: tuple[tuple[int, int], ...]
    generation: tuple[int, ...]
    paused: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LeaderFailed:
    """Sent in place of a ``Decision`` when rank 0's scheduler raised: ``message`` says
    what (the exception's type and text)."""

    message: str


class RankError(RuntimeError):
    """Rank 0's scheduler failed this iteration; raised on a follower so that its loop
    ends too instead of waiting in a broadcast rank 0 will never join."""


class RankLink(Protocol):
    """How rank 0's decision reaches the other ranks. ``is_leader``: whether this rank
    decides. ``share(decision)``: on the leader, send ``decision`` and return it; on a
    follower (``decision`` is ``None``), return the leader's for this iteration, or raise
    ``RankError`` if the leader failed it. ``fail(message)``: on the leader, in place of
    ``share`` when deciding raised (the caller then raises its own error)."""

    @property
    def is_leader(self) -> bool: ...

    def share(self, decision: Decision | None) -> Decision: ...

    def fail(self, message: str) -> None: ...


class DistLink:
    """A ``RankLink`` over an object broadcast from rank 0 (``broadcast(obj, root)``,
    the shape of TensorRT-LLM's ``Distributed.broadcast`` in
    ``tensorrt_llm/_torch/distributed/communicator.py``; stored copies read, commit not
    exposed)."""

    def __init__(self, dist: object, rank: int) -> None:
        self._dist = dist
        self._rank = rank

    @property
    def is_leader(self) -> bool:
        return self._rank == 0

    def share(self, decision: Decision | None) -> Decision:
        shared = self._dist.broadcast(decision, root=0)  # type: ignore[attr-defined]
        if isinstance(shared, LeaderFailed):
            raise RankError(f"rank 0's scheduler failed this iteration: {shared.message}")
        if not isinstance(shared, Decision):
            raise RankError(f"rank {self._rank} received no schedule from rank 0")
        return shared

    def fail(self, message: str) -> None:
        # Every follower is waiting in this iteration's broadcast: MPI's has no timeout.
        self._dist.broadcast(LeaderFailed(message), root=0)  # type: ignore[attr-defined]
