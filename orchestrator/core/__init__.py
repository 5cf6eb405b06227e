"""The pure-Python core: scheduler, KV block manager, engine step and their seams.

This package exports the seams and nothing else; the gateway, the simulator, the
benchmark client and the executor plug-ins use only these names. It imports no torch,
numpy, FastAPI or TensorRT-LLM (a test checks).
"""

from orchestrator.core.calibration import shape_plan, time_step
from orchestrator.core.clock import Clock, VirtualClock, WallClock
from orchestrator.core.config import (
    AdmissionConfig,
    CacheConfig,
    ConfigError,
    EngineConfig,
    ExecutorSpec,
    FairShareConfig,
    ModelConfig,
    PredictorConfig,
    SchedulerConfig,
    SLOBudgetConfig,
    SLOClassConfig,
    StepTimePrior,
    StrictModel,
    format_errors,
    load_engine_config,
    load_yaml,
)
from orchestrator.core.constraint import ConstraintKind, ConstraintSpec
from orchestrator.core.engine import EngineCore, EngineStats, EngineStep
from orchestrator.core.errors import AdmissionError, EngineDeadError, EngineError, OverloadedError
from orchestrator.core.executor import (
    Executor,
    ExecutorFactory,
    ExecutorInfo,
    UnknownExecutorError,
    create_executor,
    executor_class,
    registered_executors,
)
from orchestrator.core.kv.hashing import BlockHash, block_hash, prefix_hashes, root_hash
from orchestrator.core.output import (
    RequestOutput,
    ScheduledRequest,
    SchedulerOutput,
    StepCost,
    StepResult,
    TokenLogprobs,
)
from orchestrator.core.predictor import (
    ErrorWindow,
    LinearStepTimePredictor,
    ModelStepTimePredictor,
    PredictorState,
    StepFeatures,
    StepTimePredictor,
    features_of,
    fit_prior,
    mixed_step,
)
from orchestrator.core.request import FinishReason, SamplingParams, Submission

__all__ = [
    "AdmissionConfig",
    "AdmissionError",
    "BlockHash",
    "CacheConfig",
    "Clock",
    "ConfigError",
    "ConstraintKind",
    "ConstraintSpec",
    "EngineConfig",
    "EngineCore",
    "EngineDeadError",
    "EngineError",
    "EngineStats",
    "EngineStep",
    "ErrorWindow",
    "Executor",
    "ExecutorFactory",
    "ExecutorInfo",
    "ExecutorSpec",
    "FairShareConfig",
    "FinishReason",
    "LinearStepTimePredictor",
    "ModelConfig",
    "ModelStepTimePredictor",
    "OverloadedError",
    "PredictorConfig",
    "PredictorState",
    "RequestOutput",
    "SLOBudgetConfig",
    "SLOClassConfig",
    "SamplingParams",
    "ScheduledRequest",
    "SchedulerConfig",
    "SchedulerOutput",
    "StepCost",
    "StepFeatures",
    "StepResult",
    "StepTimePredictor",
    "StepTimePrior",
    "StrictModel",
    "Submission",
    "TokenLogprobs",
    "UnknownExecutorError",
    "VirtualClock",
    "WallClock",
    "block_hash",
    "create_executor",
    "executor_class",
    "features_of",
    "fit_prior",
    "format_errors",
    "load_engine_config",
    "load_yaml",
    "mixed_step",
    "prefix_hashes",
    "registered_executors",
    "root_hash",
    "shape_plan",
    "time_step",
]
