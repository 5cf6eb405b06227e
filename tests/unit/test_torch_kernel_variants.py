"""Every kernel of every variant this CPU runs against its torch reference: the
elementwise kernels in both dtypes and the compact projections over their layouts.
(Attention and RoPE run per variant in test_torch_paged.py.)"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from orchestrator.core import SamplingParams
from plugins.torch_executor.compact import INT8_GROUP, WeightFormat, applies, compact
from plugins.torch_executor.kernel_build import VARIANT_NAMES
from plugins.torch_executor.linear import Linear
from plugins.torch_executor.model import rms_norm, silu_mul
from plugins.torch_executor.native import COMPACT_MAX_ROWS, Kernels
from plugins.torch_executor.sampler import Sampler, SampleRow, inverse_cdf_draw
from tests.unit.test_torch_paged import variant_kernels


@pytest.fixture(scope="module", params=VARIANT_NAMES)
def kernels(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Kernels:
    return variant_kernels(request.param, Path(tmp_path_factory.mktemp("kernels")))


def test_the_library_is_built_for_its_variant(kernels: Kernels) -> None:
    isa = kernels.lib.kernels_isa
    isa.restype = ctypes.c_char_p
    expected = {"amx": "avx512", "avx512": "avx512", "avx2": "avx2", "portable": "portable"}
    assert isa().decode() == expected[kernels.variant]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [576, 37])  # whole vectors, and a scalar tail
def test_rms_norm_and_silu_mul_match_torch(kernels: Kernels, dtype: torch.dtype, dim: int) -> None:
    gen = torch.Generator().manual_seed(dim)
    x = torch.randn(19, dim, generator=gen).to(dtype)
    w = torch.randn(dim, generator=gen).to(dtype)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.0, "rtol": 2**-7}
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-5), rms_norm(x, w, 1e-5), **tol)
    gate_up = torch.randn(19, 2 * dim, generator=gen).to(dtype) * 4
    expected = silu_mul(gate_up).float()
    got = kernels.silu_mul(gate_up).float()
    # bfloat16: one rounding of silu (as transformers) either side of a ~1 ulp exp.
    torch.testing.assert_close(
        got, expected, atol=1e-5, rtol=1e-5 if dtype == torch.float32 else 2**-6
    )


@pytest.mark.parametrize("vocab", [1024, 1031, 5])  # whole vectors, a tail, a tail alone
def test_sample_rows_draws_as_the_torch_path_does(kernels: Kernels, vocab: int) -> None:
    """The same uniforms pick the same tokens as softmax and a float64 cumulative sum;
    masked tokens never, the extreme uniforms the first and last unmasked ones."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(64, vocab, generator=gen) * 3
    logits[:, 1::3] = -torch.inf
    logits[5] = -torch.inf
    logits[5, 2] = 0.0  # a row with one token left
    inv_temps = 1.0 / torch.rand(64, generator=gen).clamp(min=0.05)
    uniforms = torch.rand(64, dtype=torch.float64, generator=gen)
    uniforms[0], uniforms[1] = 0.0, 1.0 - 2.0**-53
    got = kernels.sample_rows(logits, inv_temps, uniforms)
    expected = inverse_cdf_draw(torch.softmax(logits * inv_temps[:, None], dim=-1), uniforms)
    assert torch.equal(got, expected)
    assert bool((logits.gather(1, got[:, None]) > -torch.inf).all())
    unmasked = (logits[0] > -torch.inf).nonzero().flatten()
    assert got[0] == unmasked[0] and got[1] == (logits[1] > -torch.inf).nonzero().max()
    assert got[5] == 2


@pytest.mark.parametrize("mix", ["temperature only", "with greedy and top-p rows"])
def test_sampler_on_the_kernels_picks_what_it_picks_without(kernels: Kernels, mix: str) -> None:
    logits = torch.randn(12, 300, generator=torch.Generator().manual_seed(2)) * 2
    params = [SamplingParams(temperature=0.5 + i / 8, seed=i) for i in range(12)]
    if mix != "temperature only":
        params[3] = SamplingParams(temperature=0)
        params[7] = SamplingParams(temperature=1.0, top_p=0.5, seed=7)
    rows = [SampleRow(p, 40 + i) for i, p in enumerate(params)]
    with_kernels = Sampler(torch.Generator().manual_seed(0), kernels).sample(logits, rows)[0]
    without = Sampler(torch.Generator().manual_seed(0)).sample(logits, rows)[0]
    assert with_kernels == without


def quantized_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 projections' activation operand (int16), computed as the kernels do in
    float32: per row and group of 64, scale ``max|x| / 32767`` and ``q = x * (32767 /
    max|x|)`` rounded half away from zero -> ``(q [rows, k], scales [rows, k / 64])``."""
    groups = x.view(x.shape[0], -1, INT8_GROUP)
    amax = groups.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 32767.0 / amax, torch.zeros_like(amax))
    v = (groups * inv).clamp(-32767, 32767)
    q = torch.sign(v) * torch.floor(v.abs() + 0.5)
    return q.view_as(x), (amax / 32767.0).squeeze(-1)


SHAPES = [(16, 64), (960, 576), (576, 1536)]
ROWS = [1, 2, 3, 4, 5, 9, COMPACT_MAX_ROWS, 33, 64]  # past the default bound: a measured one


@pytest.mark.parametrize("fmt", [WeightFormat.INT8, WeightFormat.BFLOAT16])
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_compact_projections_are_the_product_with_their_layout(
    kernels: Kernels, fmt: WeightFormat, out_features: int, in_features: int, rows: int
) -> None:
    """``residual + x @ W.T`` for the layout's exact weights (``CompactWeight.dense``)
    and, for int8, the exact quantised activations (``quantized_activations``): integer
    sums are exact, bfloat16 ones float32, so within float32 rounding of the sum's
    magnitude."""
    gen = torch.Generator().manual_seed(rows + out_features)
    layer = Linear(torch.randn(out_features, in_features, generator=gen))
    x = torch.randn(rows, in_features, generator=gen)
    residual = torch.randn(rows, out_features, generator=gen)
    exact = layer.compact_weight(fmt).dense().double()
    operand = x.double()
    if fmt is WeightFormat.INT8:
        q, scales = quantized_activations(x)
        operand = q.double() * scales.double().repeat_interleave(INT8_GROUP, dim=1)
    expected = (operand @ exact.T + residual.double()).float()
    bound = 1e-5 * (operand.abs() @ exact.abs().T).max().item() + 1e-6
    got = kernels.compact_linear_add(fmt, layer, x, residual, max_rows=rows)
    assert (got - expected).abs().max().item() <= bound
    plain = kernels.compact_linear(fmt, layer, x, max_rows=rows)
    assert (plain - (expected - residual)).abs().max().item() <= bound + 1e-5


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
@pytest.mark.parametrize("rows", [1, 4, COMPACT_MAX_ROWS])
def test_int8_projections_are_within_their_activation_rounding_of_float32(
    kernels: Kernels, out_features: int, in_features: int, rows: int
) -> None:
    """Against the float32 product with the float32 activations: each activation moves
    by at most half its group's step (max|x| / 32767 / 2), so each output by at most
    ``sum over groups of step / 2 * sum |W|`` (plus float32 rounding); on random data
    the typical error is far below that bound."""
    gen = torch.Generator().manual_seed(7 * rows + in_features)
    layer = Linear(torch.randn(out_features, in_features, generator=gen))
    x = torch.randn(rows, in_features, generator=gen) * 3
    exact = layer.compact_weight(WeightFormat.INT8).dense().double()
    reference = x.double() @ exact.T
    groups = x.double().view(rows, -1, INT8_GROUP)
    half_step = groups.abs().amax(-1) / 32767 / 2  # [rows, groups]
    w_mass = exact.abs().view(out_features, -1, INT8_GROUP).sum(-1)  # [out, groups]
    bound = half_step @ w_mass.T + 1e-5 * (x.double().abs() @ exact.abs().T) + 1e-6
    err = (kernels.compact_linear(WeightFormat.INT8, layer, x).double() - reference).abs()
    assert (err <= bound).all()
    # Rounding errors cancel: the mean error is a small fraction of the worst case.
    assert err.mean().item() <= 0.1 * bound.mean().item()


def test_int8_projections_of_all_zero_groups_are_zero(kernels: Kernels) -> None:
    """A group of zeros has scale 0 (no division by it): its products add nothing."""
    layer = Linear(torch.randn(32, 3 * INT8_GROUP))
    x = torch.randn(2, 3 * INT8_GROUP)
    x[0] = 0.0
    x[1, INT8_GROUP : 2 * INT8_GROUP] = 0.0
    got = kernels.compact_linear(WeightFormat.INT8, layer, x)
    assert torch.equal(got[0], torch.zeros(32))
    exact = layer.compact_weight(WeightFormat.INT8).dense()
    q, scales = quantized_activations(x[1:])
    operand = q * scales.repeat_interleave(INT8_GROUP, dim=1)
    # The kernel rounds x * (32767 / max|x|) in its own float order, so a value on a
    # rounding edge may land one step from this reference's (it did on random data, about
    # 1 run in 20): allow two steps of the scale on the largest weight.
    expected = operand.double() @ exact.double().T
    tolerance = 2 * scales.max().item() * exact.abs().max().item()
    torch.testing.assert_close(got[1:].double(), expected, atol=tolerance, rtol=1e-5)


def test_compact_projections_leave_long_batches_to_the_dense_matmul(kernels: Kernels) -> None:
    layer = Linear(torch.randn(32, 64))
    x = torch.randn(COMPACT_MAX_ROWS + 1, 64)
    assert torch.equal(kernels.compact_linear(WeightFormat.INT8, layer, x), layer(x))


def test_int8_layout_and_error_bound() -> None:
    """Blocks of 16 outputs, 4 inputs of an output adjacent; each weight within half a
    step (its group's largest magnitude / 127 / 2) of the original."""
    w = torch.randn(48, 2 * INT8_GROUP)
    c = compact(w, WeightFormat.INT8)
    assert c.values.shape == (3, 2 * INT8_GROUP // 4, 16, 4) and c.values.dtype == torch.int8
    assert c.scales is not None and c.scales.shape == (3, 2, 16)
    assert c.values[1, 5 // 4, 7, 5 % 4] == torch.round(w[16 + 7, 5] / c.scales[1, 0, 7])
    assert c.values[2, 100 // 4, 3, 100 % 4] == torch.round(w[32 + 3, 100] / c.scales[2, 1, 3])
    step = w.view(48, 2, INT8_GROUP).abs().amax(-1, keepdim=True) / 127
    err = (c.dense() - w).view(48, 2, INT8_GROUP).abs()
    assert (err <= step / 2 + 1e-7).all()
    assert c.num_bytes == 48 * 128 + 48 * 2 * 4


def test_layouts_exist_only_for_whole_blocks_and_groups() -> None:
    assert applies(WeightFormat.INT8, 576, 1536) and applies(WeightFormat.BFLOAT16, 16, 2)
    assert not applies(WeightFormat.INT8, 40, 64)  # not whole blocks of 16 outputs
    assert not applies(WeightFormat.INT8, 32, 96)  # not whole groups of 64 inputs
    assert not applies(WeightFormat.DENSE, 32, 64)
    with pytest.raises(ValueError, match="no int8 layout"):
        compact(torch.randn(40, 64), WeightFormat.INT8)
