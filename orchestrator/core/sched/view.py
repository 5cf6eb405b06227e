"""What admission policies and the forecast may read of the scheduler: a narrow,
read-only view (``SchedulerView``), so a policy cannot change the scheduler's state and
a reader sees at a glance what a policy depends on. ``Scheduler`` satisfies it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from orchestrator.core.config import SchedulerConfig
from orchestrator.core.predictor import StepTimePredictor
from orchestrator.core.request import Request
from orchestrator.core.sched.ordering import OrderingPolicy, SortKey
from orchestrator.core.sched.room import RoomView
from orchestrator.core.sched.slo import ArrivalRate


class WaitingView(Protocol):
    """The waiting queue as admission sees it: its size, its uncomputed tokens and the
    requests ranked ahead of an admission key (``RequestQueue``'s read side)."""

    @property
    def num_tokens(self) -> int: ...

    def ahead_of(self, key: SortKey) -> Iterator[Request]: ...

    def __len__(self) -> int: ...


class PrefixCacheView(Protocol):
    """The KV manager's read-only prefix probe."""

    def probe_cached_tokens(self, request: Request) -> int: ...


class BlockCounts(Protocol):
    """The KV pool's size (blocks) and the blocks a number of tokens takes."""

    @property
    def num_blocks(self) -> int: ...

    def blocks_for(self, num_tokens: int) -> int: ...


class OutputLengthView(Protocol):
    """The SLO bookkeeping's read side for the forecast (``slo.SloTracker``)."""

    def expected_output_tokens(self, request: Request) -> int: ...


class CompileView(Protocol):
    """The grammar compiles' read side for admission (``constraints.ConstraintCompiles``)."""

    def expected_s(self, request: Request) -> float: ...


class SchedulerView(Protocol):
    """The scheduler's state as of a submission (times in seconds on the engine clock).

    ``running``: best first; ``slo.expected_output_tokens(request)``: the output length
    a request is expected to reach (tokens); ``preempt_for_priority``: whether a waiting request may
    evict a running one of worse priority; ``step_end_time``: when the step in flight ends (a
    request submitted earlier waits for it); ``step_budget()``: the next step's token
    budget; ``admitted_rate(better_than)``: the recent rate of queued requests (all, or
    those of a better priority than ``better_than``); ``constraints.expected_s(request)``:
    how long (s) its grammar is expected to compile before it can be scheduled;
    ``room``: the steps that had room for another prompt, by which refusals are judged.
    """

    @property
    def config(self) -> SchedulerConfig: ...

    @property
    def running(self) -> Sequence[Request]: ...

    @property
    def waiting(self) -> WaitingView: ...

    @property
    def kv(self) -> PrefixCacheView: ...

    @property
    def ordering(self) -> OrderingPolicy: ...

    @property
    def predictor(self) -> StepTimePredictor: ...

    @property
    def slo(self) -> OutputLengthView: ...

    @property
    def constraints(self) -> CompileView: ...

    @property
    def room(self) -> RoomView: ...

    @property
    def step_end_time(self) -> float: ...

    @property
    def preempt_for_priority(self) -> bool: ...

    def step_budget(self) -> int: ...

    def admitted_rate(self, better_than: int | None = None) -> ArrivalRate: ...
