"""The Llama forward as pure functions over a flat ragged batch of tokens.

Every scheduled token of every request (prefill chunks and single decode tokens alike)
runs as one row of ``[num_tokens, hidden]``; only attention needs to know which rows
belong to which request, and that knowledge lives in the ``Attention`` callable the
caller passes in (paged for serving, dense for a baseline). Numerics follow
transformers' Llama: RMSNorm in float32, rotate-half RoPE, float32 softmax.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F

from plugins.torch_executor.weights import LayerWeights, LlamaWeights, ModelArgs


class Attention(Protocol):
    """Attention of one layer over a batch whose per-request layout the callable knows.

    ``q``: ``[num_tokens, heads, head_dim]``; ``k``, ``v``: ``[num_tokens, kv_heads,
    head_dim]`` (RoPE applied), rows in the order of the batch's tokens. Returns
    ``[num_tokens, heads, head_dim]``.
    """

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...


class RotaryTable:
    """cos/sin of every position up to ``max_len``, precomputed once: ``[max_len, head_dim]``."""

    def __init__(self, args: ModelArgs, max_len: int, dtype: torch.dtype) -> None:
        inv_freq = rope_inverse_frequencies(args)  # [head_dim / 2], float32
        positions = torch.arange(max_len, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]  # [max_len, head_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_len, head_dim]
        self.cos = emb.cos().to(dtype)
        self.sin = emb.sin().to(dtype)
        self.max_len = max_len

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x``: ``[num_tokens, n_heads, head_dim]`` at ``positions``: ``[num_tokens]``."""
        cos = self.cos[positions].unsqueeze(1)  # [num_tokens, 1, head_dim]
        sin = self.sin[positions].unsqueeze(1)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


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


def decoder_layer(
    index: int,
    w: LayerWeights,
    args: ModelArgs,
    h: torch.Tensor,
    positions: torch.Tensor,
    rope: RotaryTable,
    attention: Attention,
) -> torch.Tensor:
    """One pre-norm decoder layer on ``h``: ``[num_tokens, hidden]``; returns the same shape."""
    n = h.shape[0]
    nq, nkv, hd = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim, args.head_dim
    qkv = w.qkv(rms_norm(h, w.input_norm, args.rms_norm_eps))  # [n, nq + 2 * nkv]
    q = qkv[:, :nq].view(n, args.num_heads, hd)
    k = qkv[:, nq : nq + nkv].view(n, args.num_kv_heads, hd)
    v = qkv[:, nq + nkv :].view(n, args.num_kv_heads, hd)
    q, k = rope.apply(q, positions), rope.apply(k, positions)
    attn = attention(index, q, k, v.contiguous())  # [n, heads, head_dim]
    h = h + w.o(attn.reshape(n, nq))
    gate_up = w.gate_up(rms_norm(h, w.post_norm, args.rms_norm_eps))  # [n, 2 * inter]
    gate, up = gate_up.chunk(2, dim=-1)
    return h + w.down(F.silu(gate) * up)


def forward_hidden(
    weights: LlamaWeights,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    rope: RotaryTable,
    attention: Attention,
) -> torch.Tensor:
    """Hidden states before the final norm: ``[num_tokens, hidden]`` for ``token_ids``
    and ``positions`` (both ``[num_tokens]``, int64)."""
    h = weights.embed[token_ids]  # [num_tokens, hidden]
    for i, layer in enumerate(weights.layers):
        h = decoder_layer(i, layer, weights.args, h, positions, rope, attention)
    return h


def compute_logits(weights: LlamaWeights, hidden: torch.Tensor) -> torch.Tensor:
    """``hidden``: ``[rows, hidden]`` (only the rows that need logits) -> float32
    ``[rows, vocab]``."""
    normed = rms_norm(hidden, weights.norm, weights.args.rms_norm_eps)
    return weights.lm_head(normed).float()
