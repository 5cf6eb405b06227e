"""The request headers llm-d's endpoint picker (the Gateway API Inference Extension's EPP)
and its clients send a model server, read once per API request.

Names are llm-d's own (``pkg/epp/metadata/consts.go`` in llm-d/llm-d-router): each has
a current name and a deprecated alias, read only when the current name is absent, as
the picker reads them (``GetLowerCaseHeaderValue`` there):

- ``x-llm-d-slo-ttft-ms`` / ``x-llm-d-slo-tpot-ms`` (aliases ``x-slo-ttft-ms`` /
  ``x-slo-tpot-ms``): the request's own TTFT and TPOT targets in milliseconds. They
  replace its SLO class's targets for this request alone (``Submission.ttft_target_s``,
  ``tpot_target_s``), so SLO admission, deadline order, the SLO token budget and
  shedding all use them.
- ``x-llm-d-inference-fairness-id`` (alias ``x-gateway-inference-fairness-id``): the
  tenant whose fair share the request counts against, unless a bearer key names one.
- ``x-llm-d-inference-objective`` (alias ``x-gateway-inference-objective``): the name
  of an InferenceObjective, mapped by ``server.objectives`` to a priority and/or an SLO
  class. An unknown name leaves the defaults, as the picker does for an objective it has
  no InferenceObjective for (``getInferenceObjective`` in llm-d/llm-d-router's
  ``pkg/epp/requestcontrol/director.go``): the request was already routed under it, and
  refusing it here would fail a request the fleet accepted.

A value that is present but malformed (not a number, not positive, over the limits the
config's SLO classes accept, or a name that is empty, too long or not printable) is a
400 naming the header; nothing else about the request changes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.datastructures import Headers

from orchestrator.core import MAX_TPOT_MS, MAX_TTFT_MS
from orchestrator.gateway.config import ObjectiveConfig
from orchestrator.gateway.errors import APIError

logger = logging.getLogger(__name__)

TTFT_HEADER = "x-llm-d-slo-ttft-ms"
TPOT_HEADER = "x-llm-d-slo-tpot-ms"
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
# Deprecated names llm-d still reads when the current one is absent.
ALIASES: dict[str, str] = {
    TTFT_HEADER: "x-slo-ttft-ms",
    TPOT_HEADER: "x-slo-tpot-ms",
    FAIRNESS_HEADER: "x-gateway-inference-fairness-id",
    OBJECTIVE_HEADER: "x-gateway-inference-objective",
}
# Longest fairness id or objective name (characters): an objective is a Kubernetes
# object name (253 at most); a fairness id is kept to the same bound.
MAX_NAME_CHARS = 253


@dataclass(frozen=True, slots=True)
class LlmdHints:
    """What the llm-d headers of one API request ask for; ``None`` where absent.
    Targets are in seconds; ``priority`` and ``slo_class`` come from the objective's
    entry in ``server.objectives`` (the request's own fields win over them)."""

    ttft_target_s: float | None = None
    tpot_target_s: float | None = None
    fairness_id: str | None = None
    objective: str | None = None
    priority: int | None = None
    slo_class: str | None = None


def _value(headers: Headers, name: str) -> tuple[str, str] | None:
    """``(header name as sent, value)`` of ``name``, else of its deprecated alias."""
    for candidate in (name, ALIASES[name]):
        value = headers.get(candidate)
        if value is not None:
            return candidate, value
    return None


def _invalid(header: str, reason: str) -> APIError:
    return APIError(400, f"{header}: {reason}", param=header, code="invalid_value")


def _milliseconds(headers: Headers, name: str, limit_ms: float) -> float | None:
    """The header's target in seconds, from milliseconds in ``(0, limit_ms]``."""
    found = _value(headers, name)
    if found is None:
        return None
    header, text = found
    try:
        ms = float(text.strip())
    except ValueError:
        raise _invalid(header, f"must be a number of milliseconds, got {text[:32]!r}") from None
    # ``not 0 < ms <= limit`` also refuses NaN, which compares false to everything.
    if not 0 < ms <= limit_ms:
        raise _invalid(header, f"must be above 0 and at most {limit_ms:g} ms, got {text[:32]!r}")
    return ms / 1e3


def _name(headers: Headers, name: str) -> str | None:
    found = _value(headers, name)
    if found is None:
        return None
    header, text = found
    if not 0 < len(text) <= MAX_NAME_CHARS or not text.isprintable():
        raise _invalid(header, f"must be 1 to {MAX_NAME_CHARS} printable characters")
    return text


def read_hints(headers: Headers, objectives: Mapping[str, ObjectiveConfig]) -> LlmdHints:
    """The llm-d headers of one request, validated; ``APIError`` (400, naming the
    header) for a malformed one. ``objectives`` is ``server.objectives``."""
    objective = _name(headers, OBJECTIVE_HEADER)
    entry = objectives.get(objective) if objective is not None else None
    if objective is not None and entry is None:
        logger.debug("objective %r is not in server.objectives; using the defaults", objective)
    return LlmdHints(
        ttft_target_s=_milliseconds(headers, TTFT_HEADER, MAX_TTFT_MS),
        tpot_target_s=_milliseconds(headers, TPOT_HEADER, MAX_TPOT_MS),
        fairness_id=_name(headers, FAIRNESS_HEADER),
        objective=objective,
        priority=entry.priority if entry is not None else None,
        slo_class=entry.slo_class if entry is not None else None,
    )
