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
