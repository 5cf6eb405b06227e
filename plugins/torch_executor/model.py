"""The Llama forward as pure functions over a flat ragged batch of tokens.

Every scheduled token of every request (prefill chunks and single decode tokens alike)
runs as one row of ``[num_tokens, hidden]``; only attention needs to know which rows
belong to which request and where they sit, and that knowledge lives in the
``Attention`` callable the caller passes in (paged for serving, dense for a baseline),
which also applies RoPE, since the positions are its to know. Numerics follow
transformers' Llama: RMSNorm in float32, rotate-half RoPE, float32 softmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch
import torch.nn.functional as F

from plugins.torch_executor.buckets import pad_dim
from plugins.torch_executor.compact import WeightFormat
from plugins.torch_executor.linear import Linear, bfloat16_linear, bfloat16_linear_add
from plugins.torch_executor.native import COMPACT_MAX_ROWS, Kernels
from plugins.torch_executor.weights import LayerWeights, LlamaWeights, ModelArgs


@dataclass(frozen=True, slots=True)
class Ops:
    """How a layer runs its parts: ``norm(x, weight, eps)``, RMSNorm of ``x`` ``[rows,
    hidden]``; ``silu_mul(gate_up)``, ``silu(gate) * up`` of ``[rows, 2 * inter]`` ->
    ``[rows, inter]``; ``linear(layer, x)``, ``layer(x)``; ``linear_add(layer, x,
    residual)``, ``layer.add(x, residual)``; ``head(lm_head, x)``, the LM head's
    ``lm_head(x)``; ``gated``, below. ``TORCH_OPS`` below, or the CPU kernels (``kernel_ops``, over
    ``native.py``: one pass each, and the projections on AMX tiles or over compact
    weights)."""

    norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]
    linear: Callable[[Linear, torch.Tensor], torch.Tensor] = Linear.__call__
    linear_add: Callable[[Linear, torch.Tensor, torch.Tensor], torch.Tensor] = Linear.add
    head: Callable[[Linear, torch.Tensor], torch.Tensor] = Linear.__call__
    # ``gated(gate_up, x)``: ``silu_mul(linear(gate_up, x))`` in one op, where one exists.
    gated: Callable[[Linear, torch.Tensor], torch.Tensor] | None = None


class Attention(Protocol):
    """Attention of one layer over a batch whose per-request layout the callable knows.

    ``qkv``: ``[num_tokens, (heads + 2 * kv_heads) * head_dim]``, the fused projection's
    output (Q, then K, then V; no RoPE yet), rows in the order of the batch's tokens.
    Applies RoPE at each row's position, stores K/V as it needs, and returns ``[num_tokens,
    heads, head_dim]``.
    """

    def __call__(self, layer: int, qkv: torch.Tensor) -> torch.Tensor: ...


class RotaryTable:
    """cos/sin of every position up to ``max_len``, precomputed once: ``[max_len, head_dim]``."""

    def __init__(
        self,
        args: ModelArgs,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        inv_freq = rope_inverse_frequencies(args)  # [head_dim / 2], float32
        positions = torch.arange(max_len, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]  # [max_len, head_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_len, head_dim]
        self.cos = emb.cos().to(dtype).to(device)
        self.sin = emb.sin().to(dtype).to(device)
        self.max_len = max_len

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x``: ``[num_tokens, n_heads, head_dim]`` at ``positions``: ``[num_tokens]``."""
        # cos, sin: [num_tokens, 1, head_dim]
        return rotate(x, self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of ``x``: ``[num_tokens, n_heads, head_dim]`` with ``cos``/``sin``
    ``[num_tokens, 1, head_dim]``, rounding as transformers does."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rope_inverse_frequencies(args: ModelArgs) -> torch.Tensor:
    """``[head_dim / 2]`` float32 inverse frequencies, with Llama 3.1 scaling if configured."""
    dim = args.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (args.rope_theta**exponents)
    s = args.rope_scaling
    if s is None:
        return inv_freq
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are stretched by ``factor``, short ones kept, the band between blended.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x``: ``[..., hidden]``; normalised in float32 and cast back, as transformers does."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gate_up``: ``[rows, 2 * inter]`` (gate, then up) -> ``[rows, inter]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


TORCH_OPS = Ops(norm=rms_norm, silu_mul=silu_mul)


@dataclass(frozen=True, slots=True)
class Matmuls:
    """How the dense projections run: ``linear(layer, x)`` and ``linear_add(layer, x,
    residual)``, in the model's dtype (``DENSE``), or, for the float32 model, in bfloat16
    (``BFLOAT16``: ``linear.bfloat16_linear``, bfloat16 products, residual sums in
    float32). ``input_dtype``: what they round their inputs to (``None``: nothing), which
    a norm feeding them may write directly."""

    linear: Callable[[Linear, torch.Tensor], torch.Tensor] = Linear.__call__
    linear_add: Callable[[Linear, torch.Tensor, torch.Tensor], torch.Tensor] = Linear.add
    input_dtype: torch.dtype | None = None


DENSE = Matmuls()
BFLOAT16 = Matmuls(bfloat16_linear, bfloat16_linear_add, torch.bfloat16)


def torch_ops(dense: Matmuls = DENSE) -> Ops:
    """Torch's own ops, the projections and the LM head as ``dense`` runs them."""
    if dense is DENSE:
        return TORCH_OPS
    return Ops(rms_norm, silu_mul, dense.linear, dense.linear_add, dense.linear)


def _norm_for(
    kernels: Kernels,
    dense: Matmuls,
    max_rows: int,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """RMSNorm through the kernels, written in ``dense``'s input dtype for batches of more
    than ``max_rows`` rows (the ones ``dense`` takes): one rounding, no separate cast."""
    return kernels.rms_norm(x, weight, eps, dense.input_dtype if x.shape[0] > max_rows else None)


def kernel_ops(
    kernels: Kernels,
    weights: WeightFormat = WeightFormat.DENSE,
    max_rows: int = COMPACT_MAX_ROWS,
    dense: Matmuls = DENSE,
) -> Ops:
    """A layer's parts through the CPU ``kernels``: the elementwise ones always; the
    projections (and the LM head) over ``weights`` when it is compact (for batches of
    up to ``max_rows`` rows; longer ones as ``dense`` runs them), else as ``dense`` runs
    them: bfloat16 matmuls, or the layers' projections on AMX tiles where available."""
    if weights is WeightFormat.DENSE:
        max_rows = 0  # no batch runs on compact weights
    norm = (
        kernels.rms_norm
        if dense.input_dtype is None
        else partial(_norm_for, kernels, dense, max_rows)
    )
    if weights is not WeightFormat.DENSE:
        linear = partial(kernels.compact_linear, weights, max_rows=max_rows, dense=dense.linear)
        return Ops(
            norm=norm,
            silu_mul=kernels.silu_mul,
            linear=linear,
            linear_add=partial(
                kernels.compact_linear_add, weights, max_rows=max_rows, dense=dense.linear_add
            ),
            head=linear,
        )
    if dense is not DENSE:
        return Ops(norm, kernels.silu_mul, dense.linear, dense.linear_add, dense.linear)
    if not kernels.has_tile_linear:
        return Ops(norm=kernels.rms_norm, silu_mul=kernels.silu_mul)
    return Ops(
        norm=kernels.rms_norm,
        silu_mul=kernels.silu_mul,
        linear=kernels.linear,
        linear_add=kernels.linear_add,
        gated=kernels.gated_linear,
    )


def decoder_layer(
    index: int,
    w: LayerWeights,
    args: ModelArgs,
    h: torch.Tensor,
    attention: Attention,
    ops: Ops = TORCH_OPS,
    tokens: int | None = None,
) -> torch.Tensor:
    """One pre-norm decoder layer on ``h``: ``[rows, hidden]``; returns the same shape.
    Both residual adds ride on the projection that feeds them (``ops.linear_add``).
    ``tokens``: how many of the rows are the step's tokens (``None``: all); the rest are
    zero rows that ride along the projections (``forward_hidden``) and stay zero: only
    the tokens reach attention."""
    n = h.shape[0]
    eps = args.rms_norm_eps
    qkv = ops.linear(w.qkv, ops.norm(h, w.input_norm, eps))  # [n, (heads + 2 kv_heads) hd]
    attn = attention(index, qkv if tokens is None else qkv[:tokens])  # [tokens, heads, hd]
    attn = attn.reshape(-1, args.num_heads * args.head_dim)
    h = ops.linear_add(w.o, attn if tokens is None else pad_dim(attn, 0, n), h)
    x = ops.norm(h, w.post_norm, eps)
    if ops.gated is not None:
        act = ops.gated(w.gate_up, x)  # [n, intermediate]
    else:
        act = ops.silu_mul(ops.linear(w.gate_up, x))  # gate_up: [n, 2 * intermediate]
    return ops.linear_add(w.down, act, h)


def forward_hidden(
    weights: LlamaWeights,
    token_ids: torch.Tensor,
    attention: Attention,
    ops: Ops = TORCH_OPS,
    rows: int | None = None,
) -> torch.Tensor:
    """Hidden states before the final norm: ``[num_tokens, hidden]`` for ``token_ids``
    (``[num_tokens]``, int64); positions are ``attention``'s. ``rows``: run the layers'
    projections at this many rows (at least ``num_tokens``; ``None``: exactly those),
    the tokens' followed by zero rows. On the CPU oneDNN's matmuls run at bucketed row
    counts (``buckets.padded_rows``): padding the step once here rather than each
    matmul's input and residual saves their copies, 3% of a mixed step of 572 rows
    (811 against 836 ms; float32 over int8 weights, avx2 kernels, 2 threads of an Intel
    Xeon)."""
    h = weights.embed[token_ids]  # [num_tokens, hidden]
    tokens = None
    if rows is not None and rows != h.shape[0]:
        tokens = h.shape[0]
        h = pad_dim(h, 0, rows)
    for i, layer in enumerate(weights.layers):
        h = decoder_layer(i, layer, weights.args, h, attention, ops, tokens)
    return h if tokens is None else h[:tokens]


def compute_logits(
    weights: LlamaWeights, hidden: torch.Tensor, ops: Ops = TORCH_OPS
) -> torch.Tensor:
    """``hidden``: ``[rows, hidden]`` (only the rows that need logits) -> float32
    ``[rows, vocab]``."""
    normed = ops.norm(hidden, weights.norm, weights.args.rms_norm_eps)
    return ops.head(weights.lm_head, normed).float()
