"""One choice of an API response: an engine request's outputs turned into text deltas.

Tokens become text through the incremental detokenizer; stop strings then cut the text,
and withhold any tail that could begin one. Logprobs of every generated token are
reported with the delta of the step that produced the token, even if that step's text
is held back or cut (as the token counts in ``usage`` include them too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.common.metrics import RequestRecord
from orchestrator.core import FinishReason, RequestOutput, Submission
from orchestrator.gateway.detokenize import IncrementalDetokenizer, StopStringMatcher
from orchestrator.gateway.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token, its log-probability and the top alternatives, best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ChoiceDelta:
    """What one step adds to a choice. ``text_offset`` is where ``text`` starts in the
    choice's full text (characters). ``finish_reason`` is set on the choice's last delta.
    ``num_output_tokens`` is the choice's token count through this delta (a consumer may
    read deltas later than they were made, so it cannot ask the choice).
    """

    index: int
    text: str
    text_offset: int
    logprobs: list[TokenLogprob]
    finish_reason: FinishReason | None
    num_output_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.text and not self.logprobs and self.finish_reason is None


class ChoiceState:
    """Assembles the text of one engine request.

    ``advance(output, now)`` consumes one ``RequestOutput`` (``now`` on the engine clock,
    seconds) and returns the delta to send. When a stop string matches, the delta carries
    ``finish_reason=stop`` and ``stopped_early`` becomes true: the caller must abort the
    engine request, which does not know about stop strings.
    """

    def __init__(
        self, index: int, request: Submission, tokenizer: Tokenizer, stop: Sequence[str]
    ) -> None:
        self.index = index
        self.request = request
        # Engine facts about the request, copied from its outputs (engine-clock seconds).
        self.first_scheduled_time: float | None = None
        self.num_cached_tokens = 0
        self._detokenizer = IncrementalDetokenizer(tokenizer, request.prompt_token_ids)
        self._stop = StopStringMatcher(stop)
        self.text_length = 0
        self.token_times: list[float] = []
        self.num_output_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.stopped_early = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def advance(self, output: RequestOutput, now: float) -> ChoiceDelta:
        if self.finished:
            raise RuntimeError(f"choice {self.index} received output after it finished")
        if output.new_token_ids:
            self.token_times.append(now)
        self.num_output_tokens = output.num_output_tokens
        self.first_scheduled_time = output.first_scheduled_time
        self.num_cached_tokens = output.num_cached_tokens
        text = self._detokenizer.push(output.new_token_ids)
        if output.finished:
            text += self._detokenizer.flush()
        safe, stopped = self._stop.push(text)
        if stopped:
            self.finish_reason = FinishReason.STOP
            self.stopped_early = not output.finished
        elif output.finished:
            safe += self._stop.flush()
            self.finish_reason = output.finish_reason
        logprobs = [
            TokenLogprob(token_id, lp.logprob, list(lp.top))
            for token_id, lp in zip(output.new_token_ids, output.new_logprobs, strict=False)
        ]
        offset = self.text_length
        self.text_length += len(safe)
        return ChoiceDelta(
            self.index, safe, offset, logprobs, self.finish_reason, self.num_output_tokens
        )

    def record(self, arrival_time: float, error: str | None = None) -> RequestRecord:
        """This choice as a latency record (engine-clock seconds)."""
        return RequestRecord(
            request_id=self.request.request_id,
            arrival_time=arrival_time,
            token_times=tuple(self.token_times),
            num_prompt_tokens=len(self.request.prompt_token_ids),
            num_output_tokens=self.num_output_tokens,
            error=error,
        )
