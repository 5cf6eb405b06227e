"""The CPU kernels' bfloat16 matvec: its weight layout, its results against the exact
product, and the fall-back to the layer's own matmul where it does not apply."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from plugins.torch_executor.linear import Linear
from plugins.torch_executor.native import MATVEC_MAX_ROWS, Kernels, load_kernels


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Kernels:
    loaded = load_kernels(Path(tmp_path_factory.mktemp("kernels")))
    if loaded is None:
        pytest.skip("the CPU kernels cannot be built here (no C++ compiler)")
    if not loaded.has_matvec:
        pytest.skip("this CPU has no AVX512-BF16, so the kernels carry no matvec")
    return loaded


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """One unit in the last place of bfloat16 at each value (8 significant bits)."""
    exponent = torch.floor(torch.log2(x.abs().clamp_min(2.0**-126)))
    return 2.0 ** (exponent - 7)


def test_the_layout_pairs_inputs_within_blocks_of_16_outputs() -> None:
    weight = torch.randn(48, 10).to(torch.bfloat16)
    layout = Linear(weight, matvec=True).matvec_weight
    assert layout is not None and layout.shape == (3, 5, 16, 2)
    for block, pair, lane, half in [(0, 0, 0, 0), (2, 4, 15, 1), (1, 3, 7, 0), (1, 2, 9, 1)]:
        assert layout[block, pair, lane, half] == weight[16 * block + lane, 2 * pair + half]


@pytest.mark.parametrize(
    ("weight", "why"),
    [
        (torch.randn(32, 8), "float32"),
        (torch.randn(40, 8).to(torch.bfloat16), "40 outputs: not a multiple of 16"),
        (torch.randn(32, 9).to(torch.bfloat16), "9 inputs: odd"),
    ],
)
def test_no_layout_where_it_does_not_apply(weight: torch.Tensor, why: str) -> None:
    assert Linear(weight, matvec=True).matvec_weight is None, why


def test_no_layout_unless_asked() -> None:
    assert Linear(torch.randn(32, 8).to(torch.bfloat16)).matvec_weight is None


# 16 outputs: one block, so the second thread has none; 48: an uneven split; 50 inputs:
# an odd number of pairs (the loop's tail).
@pytest.mark.parametrize(("out_features", "in_features"), [(16, 64), (48, 50), (960, 576)])
@pytest.mark.parametrize("rows", range(1, MATVEC_MAX_ROWS + 1))
def test_matvec_is_the_exact_product_rounded_once(
    kernels: Kernels, out_features: int, in_features: int, rows: int
) -> None:
    gen = torch.Generator().manual_seed(out_features + rows)
    weight = torch.randn(out_features, in_features, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, in_features, generator=gen).to(torch.bfloat16)
    residual = torch.randn(rows, out_features, generator=gen).to(torch.bfloat16)
    layer = Linear(weight, matvec=True)
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


def test_matvec_agrees_with_the_packed_matmul(kernels: Kernels) -> None:
    gen = torch.Generator().manual_seed(7)
    layer = Linear(torch.randn(576, 1536, generator=gen).to(torch.bfloat16), matvec=True)
    x = torch.randn(1, 1536, generator=gen).to(torch.bfloat16)
    ours, theirs = kernels.linear(layer, x).float(), layer(x).float()
    assert (ours - theirs).abs().max().item() <= 2 * bf16_ulp(theirs).max().item()
    # Mostly bit for bit: the two differ only where the float32 sums round apart.
    assert (ours == theirs).float().mean().item() > 0.9


def test_more_rows_or_no_layout_take_the_layer_itself(kernels: Kernels) -> None:
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(32, 16, generator=gen).to(torch.bfloat16)
    residual = torch.randn(MATVEC_MAX_ROWS + 1, 32, generator=gen).to(torch.bfloat16)
    x = torch.randn(MATVEC_MAX_ROWS + 1, 16, generator=gen).to(torch.bfloat16)
    with_layout, without = Linear(weight, matvec=True), Linear(weight)
    assert torch.equal(kernels.linear(with_layout, x), with_layout(x))
    assert torch.equal(kernels.linear_add(with_layout, x, residual), with_layout.add(x, residual))
    assert torch.equal(kernels.linear(without, x[:1]), without(x[:1]))
