"""Dynamo's request and response dicts to and from our engine's records, and our errors
to the error kinds Dynamo's frontend turns into HTTP statuses.

Plain data only: nothing here imports Dynamo, so the mapping is tested without it. The
request dict is the ``PreprocessedRequest`` Dynamo's frontend sends a token-in worker
(``dynamo/common/backend/engine.py``, ``GenerateRequest``): prompt ``token_ids``,
``sampling_options``, ``stop_conditions``, ``output_options``, ``eos_token_ids``,
``annotations`` and ``routing``. A field we cannot honour is refused with
``UnsupportedFieldError`` naming it, never dropped. Fields the frontend itself applies
(stop strings, ``skip_special_tokens``, ``include_stop_str_in_output``) and those only
for its own use (``mdc_sum``, ``model``, ``router_config_override``) pass through.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.common.async_engine import InvalidConstraintError, RequestShedError
from orchestrator.core import (
    AdmissionError,
    ConstraintKind,
    ConstraintSpec,
    EngineDeadError,
    EngineError,
    OverloadedError,
    RequestOutput,
    SamplingParams,
    Submission,
)

# ``nvext.annotations`` entries with these prefixes carry what our gateway reads from
# headers and API keys; Dynamo's frontend forwards annotations to the worker unread.
SLO_CLASS_ANNOTATION = "slo_class:"
TENANT_ANNOTATION = "tenant:"
TTFT_ANNOTATION = "ttft_ms:"  # the request's own TTFT target (ms), as x-llm-d-slo-ttft-ms
TPOT_ANNOTATION = "tpot_ms:"  # the request's own TPOT target (ms), as x-llm-d-slo-tpot-ms

# Request keys that make a request something this worker does not serve (multimodal
# input, disaggregated prefill/decode hand-offs, an encoder's output).
_REFUSED_KEYS = (
    "multi_modal_data",
    "mm_processor_kwargs",
    "mm_routing_info",
    "encoder_result",
    "prefill_result",
    "bootstrap_info",
)

# Sampling options whose neutral value we can honour (there is nothing to do) and no
# other: our sampler has temperature, top-p, top-k and a seed, and one choice per request.
_NEUTRAL_SAMPLING: dict[str, Callable[[Any], bool]] = {
    "n": lambda v: v == 1,
    "best_of": lambda v: v == 1,
    "presence_penalty": lambda v: v == 0,
    "frequency_penalty": lambda v: v == 0,
    "repetition_penalty": lambda v: v == 1,
    "min_p": lambda v: v == 0,
    "use_beam_search": lambda v: v is False,
    "length_penalty": lambda v: v == 1,
}


class UnsupportedFieldError(ValueError):
    """A request field this worker cannot honour; ``field`` is its dotted path in
    Dynamo's request (e.g. ``sampling_options.frequency_penalty``)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The worker's facts a request is checked against: ``max_model_len`` (tokens,
    prompt plus output), ``max_tokens_limit`` (the most output tokens one request may
    ask for, ``None`` for the context only) and ``tenant_slo_classes`` (a tenant's SLO
    class when the request names none; the serve config's ``server`` section)."""

    max_model_len: int
    max_tokens_limit: int | None = None
    tenant_slo_classes: Mapping[str, str] | None = None


def _section(request: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = request.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UnsupportedFieldError(name, f"expected an object, got {type(value).__name__}")
    return value


def _int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise UnsupportedFieldError(field, f"expected an integer, got {value!r}")
    return int(value)


def _token_ids(value: Any, field: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise UnsupportedFieldError(field, "expected a list of token ids")
    return tuple(_int(v, field) for v in value)


def _sampling(options: Mapping[str, Any]) -> dict[str, Any]:
    for key, neutral in _NEUTRAL_SAMPLING.items():
        value = options.get(key)
        if value is not None and not neutral(value):
            raise UnsupportedFieldError(
                f"sampling_options.{key}", f"{value!r} is not supported by this engine"
            )
    out: dict[str, Any] = {}
    if (temperature := options.get("temperature")) is not None:
        out["temperature"] = float(temperature)
    if (top_p := options.get("top_p")) is not None:
        out["top_p"] = float(top_p)
    if (top_k := options.get("top_k")) is not None:
        # vLLM's convention, which Dynamo's frontend forwards: -1 disables top-k.
        top_k = _int(top_k, "sampling_options.top_k")
        out["top_k"] = 0 if top_k == -1 else top_k
    if (seed := options.get("seed")) is not None:
        out["seed"] = _int(seed, "sampling_options.seed")
    return out


def constraint_of(guided: Mapping[str, Any] | None) -> ConstraintSpec | None:
    """The constraint of ``sampling_options.guided_decoding`` (Dynamo's form of
    ``response_format``, ``guided_json``/``regex``/``choice``/``grammar``), or ``None``.
    ``grammar`` is read as a Lark grammar (our grammar backend's form). Refuses a
    structural tag, a whitespace pattern and more than one constraint."""
    if not guided:
        return None
    field = "sampling_options.guided_decoding"
    for key in ("structural_tag", "whitespace_pattern"):
        if guided.get(key) is not None:
            raise UnsupportedFieldError(f"{field}.{key}", "is not supported by this engine")
    given = {
        key: guided[key]
        for key in ("json", "regex", "choice", "grammar")
        if guided.get(key) is not None
    }
    if len(given) > 1:
        raise UnsupportedFieldError(field, f"one constraint at a time, got {', '.join(given)}")
    if not given:
        return None
    ((key, value),) = given.items()
    source = f"{field}.{key}"
    if key == "json":
        text = value if isinstance(value, str) else json.dumps(value)
        return ConstraintSpec(ConstraintKind.JSON_SCHEMA, text, source=source)
    if key == "choice":
        if not isinstance(value, Sequence) or isinstance(value, str) or not value:
            raise UnsupportedFieldError(source, "expected a non-empty list of strings")
        return ConstraintSpec(ConstraintKind.CHOICE, json.dumps([str(c) for c in value]), source)
    kind = ConstraintKind.REGEX if key == "regex" else ConstraintKind.GRAMMAR
    if not isinstance(value, str):
        raise UnsupportedFieldError(source, "expected a string")
    return ConstraintSpec(kind, value, source=source)


@dataclass(frozen=True, slots=True)
class Annotated:
    """What ``nvext.annotations`` carry for our engine: ``slo_class:NAME``,
    ``tenant:ID``, ``ttft_ms:N`` and ``tpot_ms:N`` (the request's own targets, in
    seconds here). Other annotations are the frontend's own and pass by."""

    slo_class: str | None = None
    tenant: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None


def _milliseconds(text: str, prefix: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UnsupportedFieldError("annotations", f"{prefix}{text} is not a number") from None
    if not 0 < value < math.inf:
        raise UnsupportedFieldError("annotations", f"{prefix}{text} must be positive")
    return value / 1e3


def annotated(annotations: Any) -> Annotated:
    """Our facts in a request's ``annotations``; ``UnsupportedFieldError`` for a target
    that is not a positive number."""
    found: dict[str, Any] = {}
    if not isinstance(annotations, Sequence) or isinstance(annotations, str):
        return Annotated()
    for item in annotations:
        if not isinstance(item, str):
            continue
        if item.startswith(SLO_CLASS_ANNOTATION):
            found["slo_class"] = item[len(SLO_CLASS_ANNOTATION) :] or None
        elif item.startswith(TENANT_ANNOTATION):
            found["tenant"] = item[len(TENANT_ANNOTATION) :] or None
        elif item.startswith(TTFT_ANNOTATION):
            found["ttft_s"] = _milliseconds(item[len(TTFT_ANNOTATION) :], TTFT_ANNOTATION)
        elif item.startswith(TPOT_ANNOTATION):
            found["tpot_s"] = _milliseconds(item[len(TPOT_ANNOTATION) :], TPOT_ANNOTATION)
    return Annotated(**found)


def to_submission(
    request: Mapping[str, Any], request_id: str, arrival_time: float, limits: RequestLimits
) -> Submission:
    """The ``Submission`` for one Dynamo request (``arrival_time``: seconds on the
    engine's clock). Raises ``UnsupportedFieldError`` naming the first field it cannot
    honour.

    Priority: Dynamo's ``routing.priority`` (``nvext.agent_hints.priority``) is higher
    first, ours lower first, so ours is its negation. Stop tokens are the request's
    ``stop_token_ids``, the frontend's hidden and visible stop ids and, unless
    ``ignore_eos``, its ``eos_token_ids``. Without ``max_tokens`` the request may fill
    the rest of the context, up to ``max_tokens_limit``.
    """
    for key in _REFUSED_KEYS:
        if request.get(key):
            raise UnsupportedFieldError(key, "is not supported by this worker")
    prompt = _token_ids(request.get("token_ids"), "token_ids")
    if not prompt:
        raise UnsupportedFieldError("token_ids", "the prompt is empty")
    sampling_options = _section(request, "sampling_options")
    stop = _section(request, "stop_conditions")
    output = _section(request, "output_options")
    routing = _section(request, "routing")

    for key in ("min_tokens", "max_thinking_tokens"):
        value = stop.get(key)
        if value:
            raise UnsupportedFieldError(
                f"stop_conditions.{key}", f"{value!r} is not supported by this engine"
            )
    if output.get("prompt_logprobs") is not None:
        raise UnsupportedFieldError("output_options.prompt_logprobs", "is not supported")
    if routing.get("cache_salt"):
        raise UnsupportedFieldError(
            "routing.cache_salt", "per-request prefix-cache isolation is not supported"
        )

    room = limits.max_model_len - len(prompt)
    max_tokens_raw = stop.get("max_tokens")
    if max_tokens_raw is None:
        max_tokens = max(1, room)
        if limits.max_tokens_limit is not None:
            max_tokens = min(max_tokens, limits.max_tokens_limit)
    else:
        max_tokens = _int(max_tokens_raw, "stop_conditions.max_tokens")
        if limits.max_tokens_limit is not None and max_tokens > limits.max_tokens_limit:
            raise UnsupportedFieldError(
                "stop_conditions.max_tokens",
                f"{max_tokens} exceeds this worker's limit of {limits.max_tokens_limit}",
            )
    stop_ids = {
        *_token_ids(stop.get("stop_token_ids"), "stop_conditions.stop_token_ids"),
        *_token_ids(stop.get("stop_token_ids_hidden"), "stop_conditions.stop_token_ids_hidden"),
        *_token_ids(stop.get("stop_token_ids_visible"), "stop_conditions.stop_token_ids_visible"),
    }
    if not stop.get("ignore_eos"):
        stop_ids.update(_token_ids(request.get("eos_token_ids"), "eos_token_ids"))
    logprobs_raw = output.get("logprobs")
    logprobs = None if logprobs_raw is None else _int(logprobs_raw, "output_options.logprobs")
    chosen = _sampling(sampling_options)
    try:
        sampling = SamplingParams(
            max_tokens=max_tokens,
            stop_token_ids=tuple(sorted(stop_ids)),
            logprobs=logprobs,
            **chosen,
        )
    except ValueError as exc:
        # SamplingParams names the field in its message (max_tokens, top_p, logprobs...).
        raise UnsupportedFieldError("sampling_options", str(exc)) from None
    guided = sampling_options.get("guided_decoding")
    if guided is not None and not isinstance(guided, Mapping):
        raise UnsupportedFieldError("sampling_options.guided_decoding", "expected an object")

    priority_raw = routing.get("priority")
    priority = 0 if priority_raw is None else -_int(priority_raw, "routing.priority")
    facts = annotated(request.get("annotations"))
    slo_class = facts.slo_class
    if slo_class is None and facts.tenant is not None and limits.tenant_slo_classes:
        slo_class = limits.tenant_slo_classes.get(facts.tenant)
    return Submission(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling=sampling,
        priority=priority,
        arrival_time=arrival_time,
        slo_class=slo_class,
        tenant=facts.tenant,
        constraint=constraint_of(guided),
        ttft_target_s=facts.ttft_s,
        tpot_target_s=facts.tpot_s,
    )


def to_chunk(
    output: RequestOutput, token_text: Callable[[int], str] | None = None
) -> dict[str, Any]:
    """One ``GenerateChunk`` (``dynamo/common/backend/engine.py``) from one step's
    output: the new token ids, their logprobs when asked for (``log_probs`` and
    ``top_logprobs`` aligned with ``token_ids``, ``token_text`` naming each token),
    and on the last chunk ``finish_reason`` and ``completion_usage`` with the prompt
    tokens served from the prefix cache as ``prompt_tokens_details.cached_tokens``.
    For outputs the request's stream yields (``stop`` and ``length`` endings; it raises
    for the others, ``map_error``)."""
    chunk: dict[str, Any] = {"token_ids": list(output.new_token_ids), "index": 0}
    if output.new_logprobs:
        text = token_text or (lambda token_id: f"token_id:{token_id}")
        chunk["log_probs"] = [lp.logprob for lp in output.new_logprobs]
        chunk["top_logprobs"] = [
            [
                {"rank": rank, "token_id": token_id, "token": text(token_id), "logprob": logprob}
                for rank, (token_id, logprob) in enumerate(lp.top, start=1)
            ]
            for lp in output.new_logprobs
        ]
    if output.finished:
        chunk["finish_reason"] = str(output.finish_reason)
        chunk["completion_usage"] = {
            "prompt_tokens": output.num_prompt_tokens,
            "completion_tokens": output.num_output_tokens,
            "total_tokens": output.num_prompt_tokens + output.num_output_tokens,
            "prompt_tokens_details": {"cached_tokens": output.num_cached_tokens},
        }
    return chunk


class DynamoErrorKind(enum.Enum):
    """What our error becomes on Dynamo's side. ``EXCEPTIONS`` names the exception
    ``generate`` raises (from ``dynamo.llm.exceptions``), ``HTTP_STATUS`` the status
    Dynamo 1.6.1's frontend answers with (measured; docs/fleet.md has the table)."""

    INVALID_ARGUMENT = "invalid_argument"
    RATE_LIMITED = "rate_limited"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"
    ENGINE_SHUTDOWN = "engine_shutdown"


EXCEPTIONS: dict[DynamoErrorKind, str] = {
    # The frontend shows our message with a 400.
    DynamoErrorKind.INVALID_ARGUMENT: "InvalidArgument",
    # An exception carrying an HTTP ``code``: the frontend answers with that status
    # (and its own text: "Too Many Requests", "Service temporarily unavailable").
    DynamoErrorKind.RATE_LIMITED: "HttpError",
    DynamoErrorKind.UNAVAILABLE: "HttpError",
    DynamoErrorKind.INTERNAL: "Unknown",
    # 503, and the frontend stops routing to this worker (it is marked not ready).
    DynamoErrorKind.ENGINE_SHUTDOWN: "EngineShutdown",
}

HTTP_STATUS: dict[DynamoErrorKind, int] = {
    DynamoErrorKind.INVALID_ARGUMENT: 400,
    DynamoErrorKind.RATE_LIMITED: 429,
    DynamoErrorKind.UNAVAILABLE: 503,
    DynamoErrorKind.INTERNAL: 500,
    DynamoErrorKind.ENGINE_SHUTDOWN: 503,
}


@dataclass(frozen=True, slots=True)
class MappedError:
    """An error as the worker raises it to Dynamo: the kind and the message (for the
    client where Dynamo shows it, else for the frontend's log)."""

    kind: DynamoErrorKind
    message: str


def map_error(exc: BaseException) -> MappedError:
    """The Dynamo error for an error raised while submitting one request or while
    reading its outputs (``AsyncEngine`` raises there what ended the request).

    Refusals of the request as asked (a field we cannot honour, a prompt over the
    context, an unknown SLO class, a constraint the executor cannot enforce or that did
    not compile) are invalid arguments; admission's refusal (``OverloadedError``) is a
    rate limit whose message carries the reason and the computed retry-after (Dynamo's
    frontend sends no ``Retry-After``); a request shed past its TTFT deadline is
    unavailable, as in our gateway; a dead engine is an engine shutdown, so the frontend
    stops routing to this worker; any other failure is internal, its details kept out of
    the message.
    """
    if isinstance(exc, UnsupportedFieldError | InvalidConstraintError):
        return MappedError(DynamoErrorKind.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, AdmissionError):
        message = f"{exc.param}: {exc}" if exc.param else str(exc)
        return MappedError(DynamoErrorKind.INVALID_ARGUMENT, message)
    if isinstance(exc, OverloadedError):
        return MappedError(
            DynamoErrorKind.RATE_LIMITED,
            f"{exc} ({exc.code}); retry after {exc.retry_after_header_s} s",
        )
    if isinstance(exc, RequestShedError):
        return MappedError(DynamoErrorKind.UNAVAILABLE, f"{exc} ({exc.code})")
    if isinstance(exc, EngineDeadError):
        return MappedError(DynamoErrorKind.ENGINE_SHUTDOWN, str(exc))
    if isinstance(exc, EngineError):
        return MappedError(DynamoErrorKind.INTERNAL, str(exc))
    return MappedError(DynamoErrorKind.INTERNAL, "internal error")


def to_exception(error: MappedError, exceptions: Any) -> Exception:
    """The exception to raise for ``error``; ``exceptions`` is ``dynamo.llm.exceptions``
    (or a fake with the same names)."""
    cls = getattr(exceptions, EXCEPTIONS[error.kind])
    if EXCEPTIONS[error.kind] == "HttpError":
        exc: Exception = cls(HTTP_STATUS[error.kind], error.message)
        return exc
    exc = cls(error.message)
    return exc
