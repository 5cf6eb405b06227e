"""The memory plan against numbers worked out by hand."""

from __future__ import annotations

from build_engines.memory import kv_bytes_per_token_per_gpu, plan_memory, weight_bytes_per_gpu
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
    # Embedding 128256 x 8192 in BF16, replicated: x 2             =  2,101,346,304
    # LM head 128256 x 8192 in BF16, split over TP=2: x 2 / 2       =  1,050,673,152
    # Weights per GPU                                               = 37,380,177,920
    assert m.weight_bytes == 37_380_177_920

    # KV per token per GPU: 80 layers x 2 (K, V) x 8 KV heads x 128 x 1 byte / 2 = 81,920
    assert m.kv_bytes_per_token == 81_920

    # Workspace:
    #   reserve                                                 2,000,000,000
    #   activations: 8192 tokens x 2 B x (2 x 8192 + 2 x 28672 / 2)
    #              = 8192 x 2 x 45,056                      =   738,197,504
    #   logits: 128 sequences x (128256 / 2) x 4 B (FP32)    =    32,833,536
    #   total                                                = 2,771,031,040
    assert m.activation_bytes == 738_197_504
    assert m.logits_bytes == 32_833_536
    assert m.workspace_bytes == 2_771_031_040

    # Free: 80,000,000,000 - 37,380,177,920 - 2,771,031,040 = 39,848,791,040
    assert m.free_after_weights_bytes == 39_848_791_040
    # KV cache: 0.9 x 39,848,791,040 = 35,863,911,936
    assert m.kv_pool_bytes == 35_863_911_936
    # Block: 32 tokens x 81,920 = 2,621,440 bytes; 35,863,911,936 // 2,621,440 = 13,680
    # (13,680 x 2,621,440 = 35,861,299,200; the remaining 2,612,736 is under one block)
    assert m.block_bytes == 2_621_440
    assert m.kv_blocks == 13_680
    # 13,680 blocks x 32 tokens = 437,760 tokens
    assert m.kv_tokens == 437_760
    # max_seq_len 8192 = 256 blocks: 13,680 // 256 = 53 sequences
    assert m.sequences_at_max_seq_len == 53
    # typical context 2048 = 64 blocks: 13,680 // 64 = 213 sequences
    assert m.sequences_at_typical_context == 213


def test_partial_block_rounds_up() -> None:
    m = plan_memory(make_spec(), LLAMA3_70B, H100)
    assert m.blocks_for(33) == 2 and m.blocks_for(32) == 1


def test_int8_kv_is_one_byte_like_fp8() -> None:
    fp8 = kv_bytes_per_token_per_gpu(LLAMA3_70B, make_spec())
    int8 = kv_bytes_per_token_per_gpu(LLAMA3_70B, make_spec({"quantization": {"kv_cache": "int8"}}))
    bf16 = kv_bytes_per_token_per_gpu(LLAMA3_70B, make_spec({"quantization": {"kv_cache": "bf16"}}))
    assert int8 == fp8 == 81_920
    assert bf16 == 2 * fp8


def test_tp_above_kv_heads_keeps_one_head_per_rank() -> None:
    # 8 KV heads over TP=16: each rank holds one head, not half of one.
    # 80 layers x 2 x 1 head x 128 x 1 byte = 20,480
    spec = make_spec({"parallelism": {"tp": 16}})
    assert kv_bytes_per_token_per_gpu(LLAMA3_70B, spec) == 20_480


def test_pipeline_parallel_splits_layers() -> None:
    # PP=2 puts 40 of the 80 layers on a rank: half the KV per token of PP=1 at the same TP.
    pp1 = make_spec()
    pp2 = make_spec({"parallelism": {"pp": 2}})
    assert kv_bytes_per_token_per_gpu(LLAMA3_70B, pp2) == 40_960
    # The linear layers halve; embedding, LM head and the final norm do not.
    linear_half = 80 * 855_638_016 // 2 // 2
    norms_half = 40 * 2 * 8192 * 2
    assert weight_bytes_per_gpu(LLAMA3_70B, pp1) - weight_bytes_per_gpu(LLAMA3_70B, pp2) == (
        linear_half + norms_half
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
    assert m.free_after_weights_bytes < 0
    assert m.kv_pool_bytes == 0 and m.kv_blocks == 0
