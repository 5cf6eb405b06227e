"""Our settings and sampling parameters as LLM-API objects, and request outputs and
iteration statistics back as plain data."""

from __future__ import annotations

import json
import types
from typing import Any

from orchestrator.core.request import SamplingParams
from plugins.trtllm.llm_api import translate
from plugins.trtllm.llm_api.settings import CudaGraphs
from tests.trtllm import fake_llmapi as llmapi
from tests.trtllm.fake_llmapi._llm import Logprob


def test_sampling_keeps_top_p_and_leaves_an_unset_top_k_unset() -> None:
    params = translate.sampling_params(llmapi, SamplingParams(temperature=0.6), 3, 42)
    assert (params.top_k, params.top_p, params.temperature, params.seed) == (None, 1.0, 0.6, 42)
    assert (params.max_tokens, params.stop_token_ids, params.logprobs) == (3, None, None)


def test_cuda_graphs_pass_sizes_or_a_maximum_never_both() -> None:
    sized = translate.cuda_graph_config(llmapi, CudaGraphs((1, 2, 8), None, True))
    assert (sized.batch_sizes, sized.max_batch_size, sized.enable_padding) == ([1, 2, 8], 0, True)
    bounded = translate.cuda_graph_config(llmapi, CudaGraphs(None, 64, False))
    assert (bounded.batch_sizes, bounded.max_batch_size) == (None, 64)
    assert translate.cuda_graph_config(llmapi, None) is None


def completion(tokens: list[int], logprobs: list[Any], reason: str | None = None) -> Any:
    return types.SimpleNamespace(
        token_ids_diff=tokens, logprobs_diff=logprobs, finish_reason=reason
    )


def output(finished: bool, *completions: Any) -> Any:
    return types.SimpleNamespace(outputs=list(completions), finished=finished)


def test_an_output_becomes_the_update_of_its_new_tokens() -> None:
    entries = [{5: Logprob(-0.5, 1), 9: Logprob(-2.0, 2)}, {6: Logprob(-0.25, 1)}]
    update = translate.update_from(3, output(False, completion([5, 6], entries)))
    assert (update.submission, list(update.tokens), list(update.logprobs)) == (
        3,
        [5, 6],
        [-0.5, -0.25],
    )
    assert not update.final and update.finish_reason is None
    simple = translate.update_from(3, output(True, completion([7], [-1.5], "stop")))
    assert (list(simple.logprobs), simple.final, simple.finish_reason) == ([-1.5], True, "stop")
    # No log-probabilities asked for (or a count that does not match): none are made up.
    bare = translate.update_from(3, output(False, completion([8, 9], [])))
    assert list(bare.logprobs) == []


def stats(max_blocks: int, free: int) -> dict[str, Any]:
    kv = {"maxNumBlocks": max_blocks, "freeNumBlocks": free, "usedNumBlocks": max_blocks - free}
    return {"iter": 1, "kvCacheStats": {**kv, "tokensPerBlock": 32}}


def test_the_latest_kv_picture_is_read_from_dicts_or_json() -> None:
    entries = [stats(100, 90), json.dumps(stats(100, 40)), {"iter": 3}]
    snapshot = translate.kv_snapshot(entries, 12.5)
    assert snapshot == translate.KvSnapshot(100, 40, 60, 32, 12.5)
    assert translate.kv_snapshot([{"iter": 1}], 0.0) is None
    assert translate.kv_snapshot([], 0.0) is None
