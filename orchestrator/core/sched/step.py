"""The state of one scheduling step (``StepState``, created by ``Scheduler.schedule`` and
dropped when the plan is built, so nothing about a step outlives it on the scheduler),
and what happens between steps (``Outbox``)."""

from __future__ import annotations

from orchestrator.core.output import RequestOutput, ScheduledRequest
from orchestrator.core.request import FINISH_REASONS, Request, RequestStatus


class StepState:
    """What one step has decided so far.

    ``budget`` is the tokens still free this step; ``scheduled`` the plan entries by
    request id; ``preempted`` the requests preempted in this step (not readmitted in it);
    ``kv_preempted`` whether a running request had to yield for KV blocks (then nothing
    new is admitted: it would only grow the pressure that caused it).
    """

    __slots__ = ("budget", "kv_preempted", "preempted", "scheduled")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.scheduled: dict[str, ScheduledRequest] = {}
        self.preempted: set[str] = set()
        self.kv_preempted = False


class Outbox:
    """What happened between two plans, reported with the next one.

    ``finished_ids`` / ``preempted_ids``: requests whose blocks were freed (finished,
    aborted or shed / preempted) since the last plan, which names them so an executor
    can drop their state; ``outputs``: outputs made outside a step (requests shed while
    waiting), returned by the next ``update``.
    """

    __slots__ = ("finished_ids", "outputs", "preempted_ids")

    def __init__(self) -> None:
        self.finished_ids: list[str] = []
        self.preempted_ids: list[str] = []
        self.outputs: list[RequestOutput] = []

    def __bool__(self) -> bool:
        return bool(self.finished_ids or self.preempted_ids or self.outputs)

    def take_ids(self) -> tuple[list[str], list[str]]:
        """``(preempted_ids, finished_ids)``, emptied here."""
        ids = self.preempted_ids, self.finished_ids
        self.preempted_ids, self.finished_ids = [], []
        return ids

    def take_outputs(self) -> list[RequestOutput]:
        outputs, self.outputs = self.outputs, []
        return outputs


def error_output(request: Request, error: str, code: str | None = None) -> RequestOutput:
    """The final output of a request ended with ``error`` (reason ``code``, if any)."""
    return RequestOutput(
        request_id=request.request_id,
        new_token_ids=(),
        new_logprobs=(),
        finished=True,
        finish_reason=FINISH_REASONS[RequestStatus.FINISHED_ERROR],
        num_prompt_tokens=len(request.prompt_token_ids),
        num_output_tokens=len(request.output_token_ids),
        error=error,
        first_scheduled_time=request.first_scheduled_time,
        num_cached_tokens=request.num_cached_prompt_tokens,
        error_code=code,
    )
