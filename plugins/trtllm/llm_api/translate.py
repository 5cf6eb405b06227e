"""Our settings and sampling parameters as ``tensorrt_llm.llmapi`` objects, and what comes
back (request outputs, iteration statistics) as plain data.

``llmapi`` is always the ``tensorrt_llm.llmapi`` module (the real one, or the fake in
tests); every name used on it is listed in ``plugins.trtllm.names.LLM_API_BINDINGS`` (a
test holds this package to the list). Constructors are called with keywords only.
"""

from __future__ import annotations

import inspect
import json
import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core import SamplingParams
from plugins.trtllm.kv import KvSnapshot
from plugins.trtllm.llm_api.guided import Guide
from plugins.trtllm.llm_api.settings import CudaGraphs, LlmApiSettings
from plugins.trtllm.names import (
    KV_CACHE_STATS_FIELDS,
    KV_CACHE_STATS_KEY,
    WAITING_QUEUE_PRIORITY,
)
from plugins.trtllm.streams import Update


@dataclass(frozen=True)
class ReleaseOptions:
    """What the installed ``tensorrt_llm.llmapi`` offers beyond the names every targeted
    release has (plugins.trtllm.names lists them as ``optional``).

    ``pins_kv_manager_v1``: ``KvCacheConfig`` has ``use_kv_cache_manager_v2``, and it is
    passed ``False`` (the V2 manager's scheduler runs MAX_UTILIZATION whatever policy is
    asked for). ``priority_policy``: the ``WaitingQueuePolicy.PRIORITY`` member when
    ``SchedulerConfig`` takes ``waiting_queue_policy`` and ``LLM.generate_async`` takes
    ``priority``; ``None`` leaves TensorRT-LLM first-come-first-served (our scheduler's
    order still decides what is submitted when)."""

    pins_kv_manager_v1: bool
    priority_policy: Any | None

    @property
    def passes_priority(self) -> bool:
        return self.priority_policy is not None


def _fields(cls: Any) -> dict[str, Any]:
    fields = getattr(cls, "model_fields", None)
    return fields if isinstance(fields, dict) else {}


def _enum_member(annotation: Any, name: str) -> Any | None:
    """``annotation.<name>``, looking inside ``Optional[...]`` and unions."""
    for candidate in (annotation, *typing.get_args(annotation)):
        member = getattr(candidate, name, None)
        if member is not None:
            return member
    return None


def has_field(cls: Any, name: str) -> bool:
    """Whether a pydantic options class has the field ``name``."""
    return name in _fields(cls)


def priority_queue_policy(scheduler_config: Any) -> Any | None:
    """``WaitingQueuePolicy.PRIORITY``, reached through ``scheduler_config``'s
    ``waiting_queue_policy`` field; ``None`` where there is no such field or member."""
    queue_field = _fields(scheduler_config).get("waiting_queue_policy")
    if queue_field is None:
        return None
    return _enum_member(queue_field.annotation, WAITING_QUEUE_PRIORITY)


def release_options(llmapi: Any) -> ReleaseOptions:
    """Probe the module's classes (pydantic fields, ``generate_async``'s parameters)
    rather than trust a version number: pre-releases add fields between tags."""
    policy = priority_queue_policy(llmapi.SchedulerConfig)
    llm_class = llmapi.LLM
    takes_priority = "priority" in inspect.signature(llm_class.generate_async).parameters
    return ReleaseOptions(
        pins_kv_manager_v1=has_field(llmapi.KvCacheConfig, "use_kv_cache_manager_v2"),
        priority_policy=policy if takes_priority else None,
    )


def start_llm(llmapi: Any, settings: LlmApiSettings, release: ReleaseOptions) -> Any:
    """Load the model: TensorRT-LLM's ``LLM`` on the PyTorch backend (the default of
    ``tensorrt_llm.llmapi.LLM`` in every release this adapter targets). Iteration
    statistics are switched on: the KV cache picture is read from them. The grammar
    backend is the settings' (``None``: no guided decoder)."""
    kv_options: dict[str, Any] = {}
    if release.pins_kv_manager_v1:
        kv_options["use_kv_cache_manager_v2"] = False
    queue_options: dict[str, Any] = {}
    if release.priority_policy is not None:
        queue_options["waiting_queue_policy"] = release.priority_policy
    return llmapi.LLM(
        model=settings.model,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        kv_cache_config=llmapi.KvCacheConfig(
            enable_block_reuse=settings.enable_block_reuse,
            free_gpu_memory_fraction=settings.kv_cache_free_gpu_memory_fraction,
            dtype=settings.kv_cache_dtype,
            tokens_per_block=settings.tokens_per_block,
            **kv_options,
        ),
        enable_chunked_prefill=settings.enable_chunked_prefill,
        scheduler_config=llmapi.SchedulerConfig(
            capacity_scheduler_policy=getattr(
                llmapi.CapacitySchedulerPolicy, settings.capacity_scheduler_policy
            ),
            **queue_options,
        ),
        max_batch_size=settings.max_batch_size,
        max_input_len=settings.max_input_len,
        max_seq_len=settings.max_seq_len,
        max_num_tokens=settings.max_num_tokens,
        cuda_graph_config=cuda_graph_config(llmapi, settings.cuda_graphs),
        guided_decoding_backend=settings.guided_decoding_backend,
        enable_iter_perf_stats=True,
    )


def cuda_graph_config(llmapi: Any, graphs: CudaGraphs | None) -> Any:
    """``None`` turns CUDA graphs off (TorchLlmArgs' documented meaning). Batch sizes and
    a maximum are never both passed: newer releases derive the maximum from the sizes."""
    if graphs is None:
        return None
    if graphs.batch_sizes is not None:
        return llmapi.CudaGraphConfig(
            batch_sizes=list(graphs.batch_sizes), enable_padding=graphs.padding
        )
    return llmapi.CudaGraphConfig(
        max_batch_size=graphs.max_batch_size, enable_padding=graphs.padding
    )


def sampling_params(
    llmapi: Any,
    sampling: SamplingParams,
    max_tokens: int,
    seed: int | None,
    guide: Guide | None = None,
) -> Any:
    """A request for ``max_tokens`` more tokens. Greedy (temperature 0) is ``top_k=1``;
    otherwise ``top_p`` is always passed (unset, the C++ runtime's 0 with an unset
    ``top_k`` means greedy) and ``top_k`` 0 (off) is left unset.

    ``ignore_eos``: the scheduler's stop ids already hold the end-of-sequence ids the
    serving layer wants, and TensorRT-LLM must not stop on its own ones.
    ``include_stop_str_in_output``: without it the LLM API trims a stop token from the
    output, and the scheduler must see the token it stops on. ``logprobs=1`` asks for
    the chosen token's log-probability (0 would ask for none). ``detokenize=False``: the
    gateway decodes; TensorRT-LLM's text is not used. ``guide``: the request's
    constraint (``guided.guide_of``) as ``GuidedDecodingParams``, one field set."""
    greedy = sampling.greedy
    return llmapi.SamplingParams(
        max_tokens=max_tokens,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        include_stop_str_in_output=True,
        top_k=1 if greedy else (sampling.top_k or None),
        top_p=None if greedy else sampling.top_p,
        seed=None if greedy else seed,
        temperature=None if greedy else sampling.temperature,
        logprobs=None if sampling.logprobs is None else 1,
        guided_decoding=(
            None if guide is None else llmapi.GuidedDecodingParams(**{guide.field: guide.value})
        ),
        ignore_eos=True,
        detokenize=False,
    )


def llm_priority(priority: int) -> float:
    """Our priority (an integer, lower first; 0 the default) as TensorRT-LLM's (a float in
    [0, 1], higher first; 0.5 the default): strictly decreasing, 0 maps to 0.5, and every
    integer lands strictly inside (0, 1)."""
    return 0.5 - math.atan(priority) / math.pi


def update_from(submission: int, output: Any) -> Update:
    """One streamed ``RequestOutput`` (read just after it arrived) as a stream update:
    the tokens its first completion gained since the previous one."""
    completion = output.outputs[0]
    tokens = list(completion.token_ids_diff)
    entries = list(completion.logprobs_diff)
    logprobs: list[float | None] = []
    if len(entries) == len(tokens):
        logprobs = [_chosen_logprob(e, t) for e, t in zip(entries, tokens, strict=True)]
    final = bool(output.finished)
    return Update(submission, tokens, logprobs, final, completion.finish_reason if final else None)


def _chosen_logprob(entry: Any, token: int) -> float | None:
    """A completion's log-probability entry for ``token``: a ``{token: Logprob}`` map on
    the PyTorch backend's default format, a bare float in the simple format."""
    if isinstance(entry, dict):
        chosen = entry.get(token)
        return None if chosen is None else float(chosen.logprob)
    if isinstance(entry, int | float):
        return float(entry)
    return None


def kv_snapshot(entries: Sequence[Any], at_s: float) -> KvSnapshot | None:
    """The latest KV picture among ``LLM.get_stats()`` entries (dicts, or their JSON
    text: releases return either), or ``None`` if none carries one."""
    for entry in reversed(entries):
        data = json.loads(entry) if isinstance(entry, str | bytes) else entry
        kv = data.get(KV_CACHE_STATS_KEY) if isinstance(data, dict) else None
        if kv:
            max_blocks, free, used, tokens_per_block = (int(kv[k]) for k in KV_CACHE_STATS_FIELDS)
            return KvSnapshot(max_blocks, free, used, tokens_per_block, at_s)
    return None
