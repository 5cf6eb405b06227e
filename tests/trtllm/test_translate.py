"""Our settings and sampling parameters as executor binding objects."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.core.request import SamplingParams
from plugins.trtllm import translate
from plugins.trtllm.check_names import representative_settings
from tests.trtllm import fake_tensorrt_llm as executor_bindings


def test_greedy_is_top_k_1_and_nothing_else() -> None:
    config = translate.sampling_config(
        executor_bindings, SamplingParams(temperature=0, top_p=0.5, seed=3), 99
    )
    assert (config.top_k, config.top_p, config.temperature, config.seed) == (1, None, None, None)


def test_sampling_keeps_top_p_and_leaves_an_unset_top_k_unset() -> None:
    # top_p=1 must be passed: unset, the executor's default of 0 with no top_k is greedy.
    config = translate.sampling_config(executor_bindings, SamplingParams(temperature=0.6), 42)
    assert (config.top_k, config.top_p, config.temperature, config.seed) == (None, 1.0, 0.6, 42)
    config = translate.sampling_config(executor_bindings, SamplingParams(top_k=5, top_p=0.7), None)
    assert (config.top_k, config.top_p, config.seed) == (5, 0.7, None)


def test_a_request_streams_new_tokens_and_stops_on_stop_words_only() -> None:
    plain = translate.request(
        executor_bindings, (4, 5), 3, SamplingParams(), seed=None, pad_id=None
    )
    assert (plain.input_token_ids, plain.max_tokens, plain.streaming) == ([4, 5], 3, True)
    assert (plain.end_id, plain.pad_id, plain.stop_words) == (-1, None, None)
    assert plain.output_config.exclude_input_from_output
    assert not plain.output_config.return_log_probs
    asks = translate.request(
        executor_bindings,
        [1],
        2,
        SamplingParams(stop_token_ids=(7,), logprobs=0),
        seed=None,
        pad_id=0,
    )
    assert asks.stop_words == [[7]] and asks.output_config.return_log_probs


def test_the_executor_config_carries_the_settings() -> None:
    settings = representative_settings()[0]
    config = translate.executor_config(executor_bindings, settings, None)
    assert config.max_beam_width == 1
    assert config.scheduler_config.capacity_scheduler_policy is (
        executor_bindings.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    )
    kv = config.kv_cache_config
    assert (kv.enable_block_reuse, kv.max_tokens, kv.free_gpu_memory_fraction) == (True, 4096, 0.9)
    assert config.enable_chunked_context
    assert (config.max_batch_size, config.max_num_tokens) == (8, 256)
    knobs = config.extended_runtime_perf_knob_config
    assert (knobs.cuda_graph_mode, knobs.cuda_graph_cache_size) == (True, 8)
    assert config.parallel_config is None


def test_several_gpus_need_the_worker_binary() -> None:
    settings = replace(representative_settings()[0], world_size=4)
    with pytest.raises(ValueError, match=r"spans 4 GPUs.*set executor_worker_path"):
        translate.executor_config(executor_bindings, settings, None)
    config = translate.executor_config(executor_bindings, settings, Path("/w/executorWorker"))
    assert config.parallel_config.communication_type is executor_bindings.CommunicationType.MPI
    assert config.parallel_config.orchestrator_config.is_orchestrator
