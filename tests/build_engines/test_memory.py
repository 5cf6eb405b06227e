"""The build's capacity plan against numbers worked out by hand.

The accounting is the shared one (orchestrator/common/capacity.py): embedding and LM head
split over TP (ModelOpt exports with ``use_parallel_embedding``), full-vocabulary FP32
logits per sequence, KV blocks rounded up from whole tokens as TensorRT-LLM does.
"""

from __future__ import annotations

import pytest

from build_engines.memory import build_capacity, expected_capacity, plan_memory
from orchestrator.common.capacity import kv_bytes_per_token_per_gpu, weight_bytes_per_gpu
from orchestrator.common.specs import load_gpu_spec, load_model_spec
from tests.build_engines.helpers import make_spec

LLAMA3_70B = load_model_spec("llama3-70b")
H100 = load_gpu_spec("h100-sxm")


def test_llama3_70b_fp8_tp2_on_h100() -> None:
    spec = make_spec({"limits": {"max_batch_size": 128}})
    m = plan_memory(spec, LLAMA3_70B, H100)

    # Llama-3-70B: hidden 8192, 64 heads, 8 KV heads, head dim 128, MLP 28672,
    # vocab 128256, 80 layers.
    # Linear weights per layer:
    #   q, o: 8192 x 64 x 128 = 67,108,864 each        -> 134,217,728
    #   k, v: 8192 x  8 x 128 =  8,388,608 each        ->  16,777,216
    #   gate, up, down: 3 x 8192 x 28672               -> 704,643,072
    #   total                                           = 855,638,016
    # FP8 (1 byte), split over TP=2: 80 x 855,638,016 / 2  = 34,225,520,640
    # Norms in BF16 (2 bytes), replicated: (80 x 2 x 8192 + 8192) x 2 =   2,637,824
    # Embedding in BF16, split over TP=2: (128256 / 2) x 8192 x 2      =  1,050,673,152
    # LM head in BF16, split over TP=2:   (128256 / 2) x 8192 x 2      =  1,050,673,152
    # Weights per GPU                                                  = 36,329,504,768
    assert m.weight_bytes == 36_329_504_768

    # KV per token per GPU: 80 layers x 2 (K, V) x 8 KV heads x 128 x 1 byte / 2 = 81,920
    assert m.kv_bytes_per_token == 81_920

    # Workspace:
    #   reserve                                                 2,000,000,000
    #   activations: 8192 tokens x 2 B x (2 x 8192 + 2 x 28672 / 2)
    #              = 8192 x 2 x 45,056                      =   738,197,504
    #   logits: 128 sequences x 128256 (whole vocab) x 4 B   =    65,667,072
    #   total                                                = 2,803,864,576
    assert m.activation_bytes == 738_197_504
    assert m.logits_bytes == 65_667_072
    assert m.workspace_bytes == 2_803_864_576

    # Free: 80,000,000,000 - 36,329,504,768 - 2,803,864,576 = 40,866,630,656
    assert m.free_after_weights_bytes == 40_866_630_656
    # KV cache: floor(0.9 x 40,866,630,656) = floor(36,779,967,590.4) = 36,779,967,590
    assert m.kv_pool_bytes == 36_779_967_590
    # Whole tokens: 36,779,967,590 // 81,920 = 448,974 (448,974 x 81,920 = 36,779,950,080)
    # Blocks, rounded up: ceil(448,974 / 32) = 14,031 (14,030 x 32 = 448,960, 14 left over)
    assert m.block_bytes == 2_621_440
    assert m.kv_blocks == 14_031
    # 14,031 blocks x 32 tokens = 448,992 tokens
    assert m.kv_tokens == 448_992
    # max_seq_len 8192 = 256 blocks: 14,031 // 256 = 54 sequences
    assert m.sequences_at_max_seq_len == 54
    # typical context 2048 = 64 blocks: 14,031 // 64 = 219 sequences
    assert m.sequences_at_typical_context == 219


def test_partial_block_rounds_up() -> None:
    m = plan_memory(make_spec(), LLAMA3_70B, H100)
    assert m.blocks_for(33) == 2 and m.blocks_for(32) == 1


def test_int8_kv_is_one_byte_like_fp8() -> None:
    def per_token(kv: str) -> int:
        spec = make_spec({"quantization": {"kv_cache": kv}})
        return plan_memory(spec, LLAMA3_70B, H100).kv_bytes_per_token

    assert per_token("int8") == per_token("fp8") == 81_920
    assert per_token("bf16") == 2 * per_token("fp8")


def test_tp_above_kv_heads_keeps_one_head_per_rank() -> None:
    # 8 KV heads over TP=16: each rank holds one head, not half of one.
    # 80 layers x 2 x 1 head x 128 x 1 byte = 20,480
    assert kv_bytes_per_token_per_gpu(LLAMA3_70B, kv_dtype="fp8", tp=16) == 20_480


def test_pipeline_parallel_splits_layers() -> None:
    # PP=2 puts 40 of the 80 layers on a rank: half the KV per token of PP=1 at the same TP.
    assert kv_bytes_per_token_per_gpu(LLAMA3_70B, kv_dtype="fp8", tp=2, pp=2) == 40_960

    def weights(pp: int) -> int:
        return weight_bytes_per_gpu(
            LLAMA3_70B, weight_dtype="fp8", activation_dtype="bf16", tp=2, pp=pp
        )

    # The linear layers and their norms halve; embedding, LM head and final norm do not.
    linear_half = 80 * 855_638_016 // 2 // 2
    norms_half = 40 * 2 * 8192 * 2
    assert weights(1) - weights(2) == linear_half + norms_half


def test_a_tied_lm_head_shares_the_embedding_table_without_pp() -> None:
    tied = LLAMA3_70B.model_copy(update={"tie_word_embeddings": True})

    def weights(pp: int) -> int:
        return weight_bytes_per_gpu(tied, weight_dtype="fp8", activation_dtype="bf16", tp=2, pp=pp)

    table = 128256 // 2 * 8192 * 2  # one BF16 table, split over TP=2
    untied = weight_bytes_per_gpu(LLAMA3_70B, weight_dtype="fp8", activation_dtype="bf16", tp=2)
    assert untied - weights(1) == table
    # With PP the embedding and the LM head live on different ranks; the fullest-rank
    # bound counts both.
    assert weights(2) == weight_bytes_per_gpu(
        LLAMA3_70B, weight_dtype="fp8", activation_dtype="bf16", tp=2, pp=2
    )


def test_fraction_scales_the_pool() -> None:
    half = plan_memory(
        make_spec({"runtime": {"kv_cache_free_gpu_memory_fraction": 0.45}}), LLAMA3_70B, H100
    )
    full = plan_memory(make_spec(), LLAMA3_70B, H100)
    assert half.kv_pool_bytes == full.free_after_weights_bytes * 45 // 100
    assert full.kv_pool_bytes == full.free_after_weights_bytes * 9 // 10


def test_pool_is_zero_when_weights_do_not_fit() -> None:
    spec = make_spec({"parallelism": {"tp": 1}, "quantization": {"weights": "bf16"}})
    m = plan_memory(spec, LLAMA3_70B, H100)
    assert m.free_after_weights_bytes < 0 and not m.fits
    assert m.kv_pool_bytes == 0 and m.kv_blocks == 0


def test_expected_capacity_reads_a_manifest_spec_and_takes_the_run_time_fraction() -> None:
    spec = make_spec({"limits": {"max_batch_size": 128}})
    recorded = spec.model_dump(mode="json")
    assert expected_capacity(recorded) == build_capacity(spec, LLAMA3_70B, H100)
    assert expected_capacity(recorded).kv_tokens == 448_992
    lower = expected_capacity(recorded, kv_memory_fraction=0.5)
    assert lower.kv_pool_bytes == 40_866_630_656 // 2
    assert lower.kv_blocks < expected_capacity(recorded).kv_blocks


def test_expected_capacity_names_an_unknown_gpu() -> None:
    recorded = make_spec().model_dump(mode="json")
    recorded["target"]["gpu"] = "tpu-v9"
    with pytest.raises(ValueError, match="unknown hardware spec 'tpu-v9'"):
        expected_capacity(recorded)
