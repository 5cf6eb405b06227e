"""The packed linear layer computes what ``F.linear`` does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from plugins.torch_executor.linear import Linear


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 0.0)])
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("pack", [True, False])
def test_matches_f_linear(dtype: torch.dtype, atol: float, rows: int, pack: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 48, generator=gen).to(dtype)
    x = torch.randn(rows, 48, generator=gen).to(dtype)
    layer = Linear(weight, pack=pack)
    assert (layer.out_features, layer.in_features) == (96, 48)
    assert layer.num_bytes == 96 * 48 * weight.element_size()
    out = layer(x)
    assert out.shape == (rows, 96) and out.dtype == dtype
    assert torch.allclose(out.float(), F.linear(x, weight).float(), atol=atol, rtol=0)


@pytest.mark.parametrize(
    ("dtype", "atol", "rtol"), [(torch.float32, 1e-5, 0.0), (torch.bfloat16, 0.07, 2**-7)]
)
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize(("pack", "dense_from_rows"), [(True, None), (True, 64), (False, None)])
def test_add_matches_the_residual_plus_the_product(
    dtype: torch.dtype,
    atol: float,
    rtol: float,
    rows: int,
    pack: bool,
    dense_from_rows: int | None,
) -> None:
    """``add`` rounds once in bfloat16 where the unfused form rounds twice, so it may
    differ from it by about one rounding of the sum; ``dense_from_rows`` switches to the
    dense weight from that many rows without changing the result beyond that."""
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 48, generator=gen).to(dtype)
    x = torch.randn(rows, 48, generator=gen).to(dtype)
    residual = torch.randn(rows, 96, generator=gen).to(dtype)
    layer = Linear(weight, pack=pack, dense_from_rows=dense_from_rows)
    out = layer.add(x, residual)
    expected = residual.float() + F.linear(x.float(), weight.float())
    assert out.shape == (rows, 96) and out.dtype == dtype
    assert torch.allclose(out.float(), expected, atol=atol, rtol=rtol)
    assert torch.allclose(layer(x).float(), F.linear(x, weight).float(), atol=atol, rtol=rtol)
