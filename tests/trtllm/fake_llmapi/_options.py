"""Option and parameter types of the fake ``tensorrt_llm.llmapi``: the listed subset of
each, with TensorRT-LLM's field names, types and defaults.

As in TensorRT-LLM, the options classes are pydantic models that refuse unknown keys
(``StrictBaseModel``), so a wrong name or a ``None`` for a non-optional field fails here
as it would there; ``SamplingParams`` is a keyword-only dataclass, which validates
nothing at construction.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class CapacitySchedulerPolicy(enum.StrEnum):  # TensorRT-LLM: a StrEnum too
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


class WaitingQueuePolicy(enum.StrEnum):
    """Reached through ``SchedulerConfig``'s field, as the adapter does (not a listed
    module name). FCFS only in waiting_queue.py at 85942da5; PRIORITY in a later stored
    copy, whose value the sources we read do not show."""

    FCFS = "fcfs"
    PRIORITY = "priority"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The newest shape: the per-release fields (plugins/trtllm/names.py ``optional``) are
# here; tests/trtllm/fake_llmapi/_releases.py builds the 1.2-shaped module without them.
class SchedulerConfig(_Strict):
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    waiting_queue_policy: WaitingQueuePolicy = WaitingQueuePolicy.FCFS


class KvCacheConfig(_Strict):
    enable_block_reuse: bool = True
    free_gpu_memory_fraction: float | None = Field(default=0.9, ge=0, le=1)
    dtype: str = "auto"
    tokens_per_block: int = 32
    # A prototype bool, False, in the stored llm_args.py we read; a stored TensorRT-LLM
    # test also passes "auto", so later releases may default to choosing V2.
    use_kv_cache_manager_v2: bool | Literal["auto"] = False


class CudaGraphConfig(_Strict):
    batch_sizes: list[int] | None = None
    max_batch_size: int = Field(default=0, ge=0)
    enable_padding: bool = False


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    """tensorrt_llm/sampling_params.py at 000a01de: one guide per request, checked by
    ``_validate``. The listed fields only (the real class also has ``structural_tag``,
    which the adapter never sets)."""

    json: str | dict[str, object] | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False

    def _validate(self) -> None:
        num_guides = sum(bool(getattr(self, f.name)) for f in fields(self))
        if num_guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {num_guides}.")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    max_tokens: int = 32
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    logprobs: int | None = None
    guided_decoding: GuidedDecodingParams | None = None
    ignore_eos: bool = False
    detokenize: bool = True
