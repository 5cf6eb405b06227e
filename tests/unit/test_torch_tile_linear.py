"""The CPU kernels' AMX linear: its weight layout, its results against the exact product,
and the fall-back to the layer's own matmul where it does not apply."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from plugins.torch_executor.linear import Linear
from plugins.torch_executor.native import Kernels, load_kernels


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Kernels:
    loaded = load_kernels(Path(tmp_path_factory.mktemp("kernels")))
    if loaded is None:
        pytest.skip("the CPU kernels cannot be built here (no C++ compiler)")
    if not loaded.has_tile_linear:
        pytest.skip("no AMX here (a CPU without AMX-BF16, or the OS refused its tile state)")
    return loaded


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """One unit in the last place of bfloat16 at each value (8 significant bits)."""
    exponent = torch.floor(torch.log2(x.abs().clamp_min(2.0**-126)))
    return 2.0 ** (exponent - 7)


def test_the_layout_pairs_inputs_within_blocks_of_16_outputs() -> None:
    weight = torch.randn(48, 64).to(torch.bfloat16)
    layer = Linear(weight)
    assert layer.has_tile_layout
    layout = layer.tile_weight()
    assert layout.shape == (3, 32, 16, 2) and layer.tile_weight() is layout  # built once
    for block, pair, lane, half in [(0, 0, 0, 0), (2, 31, 15, 1), (1, 3, 7, 0), (1, 20, 9, 1)]:
        assert layout[block, pair, lane, half] == weight[16 * block + lane, 2 * pair + half]


@pytest.mark.parametrize(
    ("weight", "why"),
    [
        (torch.randn(32, 64), "float32"),
        (torch.randn(40, 64).to(torch.bfloat16), "40 outputs: not a multiple of 16"),
        (torch.randn(32, 48).to(torch.bfloat16), "48 inputs: not a multiple of 32"),
    ],
)
def test_no_layout_where_it_does_not_apply(weight: torch.Tensor, why: str) -> None:
    layer = Linear(weight)
    assert not layer.has_tile_layout, why
    with pytest.raises(ValueError, match="no tile layout"):
        layer.tile_weight()


def test_layers_without_a_tile_layout_take_their_own_matmul(kernels: Kernels) -> None:
    gen = torch.Generator().manual_seed(5)
    layer = Linear(torch.randn(40, 64, generator=gen).to(torch.bfloat16))
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    residual = torch.randn(3, 40, generator=gen).to(torch.bfloat16)
    assert torch.equal(kernels.linear(layer, x), layer(x))
    assert torch.equal(kernels.linear_add(layer, x, residual), layer.add(x, residual))


# 16 outputs: one block, so no second output tile and the second thread has nothing; 48:
# an odd number of blocks; (3072, 576) and (576, 1536): weights of more than one L2-sized
# chunk per thread. Rows 1, 17, 33, 63 and 300 leave partial row tiles (a padded copy),
# 16, 64 and 512 none; 17 and 48 end on a row tile without a partner.
@pytest.mark.parametrize(
    ("out_features", "in_features"), [(16, 64), (48, 96), (3072, 576), (576, 1536)]
)
@pytest.mark.parametrize("rows", [1, 2, 16, 17, 33, 48, 63, 64, 300, 512])
def test_tile_linear_is_the_exact_product_rounded_once(
    kernels: Kernels, out_features: int, in_features: int, rows: int
) -> None:
    gen = torch.Generator().manual_seed(out_features + rows)
    weight = torch.randn(out_features, in_features, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, in_features, generator=gen).to(torch.bfloat16)
    residual = torch.randn(rows, out_features, generator=gen).to(torch.bfloat16)
    layer = Linear(weight)
    product = x.double() @ weight.double().t()  # exact: bfloat16 products fit in float64
    for got, exact in [
        (kernels.linear(layer, x), product),
        (kernels.linear_add(layer, x, residual), product + residual.double()),
    ]:
        assert got.shape == (rows, out_features) and got.dtype == torch.bfloat16
        # Summed in float32 and rounded once: within one bfloat16 step of the exact value
        # (plus float32's own rounding of the sum, far below it).
        error = (got.double() - exact).abs()
        assert (error <= bf16_ulp(exact) + 1e-4).all(), error.max().item()


@pytest.mark.parametrize("rows", [1, 64, 256])
def test_tile_linear_agrees_with_the_packed_matmul(kernels: Kernels, rows: int) -> None:
    gen = torch.Generator().manual_seed(7)
    layer = Linear(torch.randn(576, 1536, generator=gen).to(torch.bfloat16))
    x = torch.randn(rows, 1536, generator=gen).to(torch.bfloat16)
    ours, theirs = kernels.linear(layer, x).float(), layer(x).float()
    assert (ours - theirs).abs().max().item() <= 2 * bf16_ulp(theirs).max().item()
    # Mostly bit for bit: the two differ only where the float32 sums round apart.
    assert (ours == theirs).float().mean().item() > 0.9


def test_tile_linear_and_torch_amx_kernels_share_threads_without_harm(kernels: Kernels) -> None:
    """A prefill as the server runs it, on two threads: projections on tiles between
    PyTorch's CPU flash attention in bfloat16 (oneDNN's AMX brgemm kernels, which keep a
    per-thread configuration between calls) and oneDNN's packed matmul for the head,
    three rounds. Each round's results equal the first round's bit for bit: no kernel
    leaves tile state another one computes with."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(11)
        layer = Linear(torch.randn(960, 576, generator=gen).to(torch.bfloat16))
        head = Linear(torch.randn(4096, 576, generator=gen).to(torch.bfloat16))
        x = torch.randn(37, 576, generator=gen).to(torch.bfloat16)
        q = torch.randn(1, 9, 37, 64, generator=gen).to(torch.bfloat16)
        kv = torch.randn(2, 1, 3, 37, 64, generator=gen).to(torch.bfloat16)

        def attention() -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(
                q, kv[0], kv[1], is_causal=True, enable_gqa=True
            )

        alone = (attention(), kernels.linear(layer, x), head(x))
        for _ in range(3):
            got = (attention(), kernels.linear(layer, x), head(x))
            for want, have in zip(alone, got, strict=True):
                assert torch.equal(want, have)
    finally:
        torch.set_num_threads(previous)


def test_the_gated_layout_puts_each_block_of_gates_before_what_it_gates() -> None:
    weight = torch.randn(96, 64).to(torch.bfloat16)  # 48 gates, then 48 values
    layer = Linear(weight)
    layout = layer.gated_tile_weight()
    assert layout.shape == (6, 32, 16, 2) and layer.gated_tile_weight() is layout
    for block, pair, lane, half in [(0, 0, 0, 0), (5, 31, 15, 1), (2, 3, 7, 0), (3, 20, 9, 1)]:
        # Output block 2b holds gates 16b.., block 2b + 1 the values 48 + 16b..
        row = 16 * (block // 2) + lane + (48 if block % 2 else 0)
        assert layout[block, pair, lane, half] == weight[row, 2 * pair + half]
    with pytest.raises(ValueError, match="no gated tile layout"):
        Linear(torch.randn(48, 64).to(torch.bfloat16)).gated_tile_weight()  # 3 blocks


# Rows as test_tile_linear_is_the_exact_product_rounded_once's (partial row tiles, a row
# tile without a partner); (3072, 576): SmolLM2's gate/up, more than one L2-sized chunk.
@pytest.mark.parametrize(("out_features", "in_features"), [(32, 64), (96, 96), (3072, 576)])
@pytest.mark.parametrize("rows", [1, 16, 17, 48, 64, 300])
def test_the_gated_projection_is_silu_mul_of_the_projection_bit_for_bit(
    kernels: Kernels, out_features: int, in_features: int, rows: int
) -> None:
    gen = torch.Generator().manual_seed(out_features + rows)
    layer = Linear(torch.randn(out_features, in_features, generator=gen).to(torch.bfloat16))
    x = torch.randn(rows, in_features, generator=gen).to(torch.bfloat16)
    got = kernels.gated_linear(layer, x)
    assert got.shape == (rows, out_features // 2) and got.dtype == torch.bfloat16
    assert torch.equal(got, kernels.silu_mul(kernels.linear(layer, x)))


def test_a_gate_up_of_an_odd_number_of_blocks_takes_the_two_ops(kernels: Kernels) -> None:
    gen = torch.Generator().manual_seed(6)
    layer = Linear(torch.randn(48, 64, generator=gen).to(torch.bfloat16))
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    assert torch.equal(kernels.gated_linear(layer, x), kernels.silu_mul(kernels.linear(layer, x)))
