"""Python faces of the CPU kernels (``csrc/``): RMSNorm, SiLU-times-up, RoPE with the
K/V cache write, paged attention for rows that attend through a block table in place,
the projections over compact weights for the float32 model (``compact.py``) and, in
bfloat16 on AMX, the layers' projections on tiles (``tile_linear``).

Why: at decode sizes each of these is a few microseconds of work behind tens of
microseconds of op dispatch, and paged attention written with torch ops must first copy
the gathered blocks (read, write, read again), which tripled the KV traffic of a decode
step. These kernels read each K/V row once, straight from the pool. At decode sizes a
projection only waits on its weights from memory: ``tile_linear`` streams them with
prefetching, and the compact projections read them in fewer bytes.

The libraries are plain C++ (no torch headers), one build per ISA level, chosen at run
time by CPUID (``kernel_build.py``); loaded through ``ctypes``, which releases the GIL
during a call. They link OpenMP by the soname torch's own runtime carries, so they share
torch's thread pool. Where no variant can be built or loaded, ``load_kernels`` returns
``None`` and callers use the torch ops instead.

Numerics: float32 accumulation everywhere; in bfloat16, RMSNorm, RoPE and SiLU round
where transformers' bfloat16 graph rounds (RMSNorm and RoPE match it bit for bit, but
for values below 2^-126, which flush to zero in the ``amx`` build); attention keeps its
scores and probabilities in float32 (transformers rounds them to bfloat16), which is
closer to the float32 model; projections sum exact products in float32 and round once,
but for int8 weights, whose kernels quantise each row of activations to int16 per group
of 64 and sum the integer products exactly in int32 per group (``compact.py``).
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from plugins.torch_executor import kernel_build
from plugins.torch_executor.compact import WeightFormat, applies
from plugins.torch_executor.cpu_features import CpuFeatures, detect
from plugins.torch_executor.linear import Linear

# The compact projections run up to this many rows unless told otherwise; longer
# batches are compute-bound and go through oneDNN's float32 matmul on the dense weight.
# The executor measures where the two cross on the CPU it runs on (row_bound.py) and
# passes that; this is the bound where nothing was measured (docs/torch_executor.md).
COMPACT_MAX_ROWS = 16

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
# The float32 model's narrower KV caches.
_KV_SUFFIX = {torch.bfloat16: "_bf16kv", torch.float16: "_f16kv"}


def kv_suffix(cache: torch.dtype) -> str:
    """What the float32 model's exports over a ``cache`` KV cache add to their name."""
    return "" if cache == torch.float32 else _KV_SUFFIX[cache]


_P = ctypes.c_void_p
_I = ctypes.c_int64
_SIGNATURES: dict[str, list[type]] = {
    "rms_norm": [_P, _P, _P, _I, _I, ctypes.c_float, ctypes.c_int],
    "silu_mul": [_P, _P, _I, _I, ctypes.c_int],
    "rope_store": [_P] * 9 + [_I] * 6 + [ctypes.c_int],
    "paged_attention": [_P] * 7 + [_I] * 8 + [ctypes.c_float, ctypes.c_int],
}
# Float32 activations over compact weights: (w, scales, x, residual, out) or (w, x,
# residual, out), then rows, n, k, threads.
_COMPACT_SIGNATURES: dict[str, list[type]] = {
    "linear_int8_f32": [_P] * 5 + [_I] * 3 + [ctypes.c_int],
    "linear_bf16w_f32": [_P] * 4 + [_I] * 3 + [ctypes.c_int],
}
# Every layer of a step in one call (stack.h, stack.py): layer addresses, num_layers, h,
# n, hidden, heads, kv_heads, head_dim, inter, eps, positions, cos, sin, slots, tables,
# seqs, lens, row_ids, num_kernel_rows, runs, num_runs, num_blocks, block_size,
# max_blocks, max_len, scale, threads.
_STACK_SIGNATURE: list[type] = (
    [_P, _I, _P]
    + [_I] * 6
    + [ctypes.c_float]
    + [_P] * 8
    + [_I, _P, _I]
    + [_I] * 4
    + [ctypes.c_float, ctypes.c_int]
)
# bfloat16 only, and only in the amx variant, where the process may use AMX (as its
# decode stack, ``decode_stack_bf16_tiles``).
_TILE_LINEAR_SIGNATURE: list[type] = [_P] * 4 + [_I] * 3 + [ctypes.c_int]
# q, k, v, tables, runs, num_runs, out, heads, kv_heads, head_dim, num_blocks, max_blocks,
# scale, threads (tile_attention_bf16).
_TILE_ATTENTION_SIGNATURE: list[type] = (
    [_P] * 5 + [_I, _P] + [_I] * 5 + [ctypes.c_float, ctypes.c_int]
)


def supports(dtype: torch.dtype) -> bool:
    """Whether the kernels have a variant for ``dtype``."""
    return dtype in _SUFFIX


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


@dataclass(frozen=True)
class Kernels:
    """The loaded library of one variant. Tensor arguments are on the CPU, in one
    supported dtype, index tensors int64; inputs are made contiguous (a no-op when they
    are), caches and index tensors must already be. Shapes are the callers' contract
    (``paged.py``, ``model.py``); nothing else is checked here. This module knows
    nothing of the model: ``model.kernel_ops`` composes these into a layer's ``Ops``."""

    lib: ctypes.CDLL
    variant: str = "portable"  # the kernel_build variant this library is
    has_tile_linear: bool = False  # AMX is in this build and this process may use it

    def linear(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """``layer(x)`` on AMX tiles where the layer has a tile layout; through ``layer``
        itself otherwise."""
        if not self.has_tile_linear or not layer.has_tile_layout or x.shape[0] == 0:
            return layer(x)
        return self._tile_linear(layer, x, None)

    def gated_linear(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """``silu_mul(layer(x))`` of a gate/up projection (``layer``: ``[2 * inter, k]``),
        ``[rows, inter]``: on AMX tiles in one pass where the layer has the gated tile
        layout (``Linear.gated_tile_weight``; the same numbers, the products never
        stored), else as the two ops."""
        if (
            not self.has_tile_linear
            or not layer.has_tile_layout
            or layer.out_features % 32
            or x.shape[0] == 0
        ):
            return self.silu_mul(self.linear(layer, x))
        return self._tile_gated(layer, x)

    def linear_add(self, layer: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``layer.add(x, residual)``, on AMX tiles as ``linear``."""
        if not self.has_tile_linear or not layer.has_tile_layout or x.shape[0] == 0:
            return layer.add(x, residual)
        return self._tile_linear(layer, x, residual.contiguous())

    def compact_linear(
        self,
        fmt: WeightFormat,
        layer: Linear,
        x: torch.Tensor,
        max_rows: int = COMPACT_MAX_ROWS,
        dense: Callable[[Linear, torch.Tensor], torch.Tensor] = Linear.__call__,
    ) -> torch.Tensor:
        """``layer(x)`` over ``layer``'s ``fmt`` weights for float32 ``x`` of 1 to
        ``max_rows`` rows; through ``dense(layer, x)`` otherwise."""
        if not self._compact_applies(fmt, layer, x, max_rows):
            return dense(layer, x)
        return self._compact_linear(fmt, layer, x, None)

    def compact_linear_add(
        self,
        fmt: WeightFormat,
        layer: Linear,
        x: torch.Tensor,
        residual: torch.Tensor,
        max_rows: int = COMPACT_MAX_ROWS,
        dense: Callable[[Linear, torch.Tensor, torch.Tensor], torch.Tensor] = Linear.add,
    ) -> torch.Tensor:
        """``layer.add(x, residual)``, over compact weights as ``compact_linear``; through
        ``dense(layer, x, residual)`` otherwise."""
        if not self._compact_applies(fmt, layer, x, max_rows):
            return dense(layer, x, residual)
        return self._compact_linear(fmt, layer, x, residual.contiguous())

    @staticmethod
    def _compact_applies(fmt: WeightFormat, layer: Linear, x: torch.Tensor, max_rows: int) -> bool:
        return (
            0 < x.shape[0] <= max_rows
            and x.dtype == torch.float32
            and applies(fmt, layer.out_features, layer.in_features)
        )

    def _compact_linear(
        self, fmt: WeightFormat, layer: Linear, x: torch.Tensor, residual: torch.Tensor | None
    ) -> torch.Tensor:
        w = layer.compact_weight(fmt)
        x = x.contiguous()
        rows = x.shape[0]
        out = x.new_empty((rows, layer.out_features))
        res = 0 if residual is None else _ptr(residual)
        shape = (rows, layer.out_features, layer.in_features, torch.get_num_threads())
        if w.scales is not None:
            self.lib.linear_int8_f32(
                _ptr(w.values), _ptr(w.scales), _ptr(x), res, _ptr(out), *shape
            )
        else:
            self.lib.linear_bf16w_f32(_ptr(w.values), _ptr(x), res, _ptr(out), *shape)
        return out

    def _tile_linear(
        self, layer: Linear, x: torch.Tensor, residual: torch.Tensor | None
    ) -> torch.Tensor:
        assert x.dtype == torch.bfloat16
        x = x.contiguous()
        rows = x.shape[0]
        out = x.new_empty((rows, layer.out_features))
        self.lib.tile_linear_bf16(
            _ptr(layer.tile_weight()), _ptr(x), 0 if residual is None else _ptr(residual),
            _ptr(out), rows, layer.out_features, layer.in_features, torch.get_num_threads(),
        )  # fmt: skip
        return out

    def _tile_gated(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        assert x.dtype == torch.bfloat16
        x = x.contiguous()
        rows = x.shape[0]
        out = x.new_empty((rows, layer.out_features // 2))
        self.lib.tile_gated_silu_bf16(
            _ptr(layer.gated_tile_weight()), _ptr(x), _ptr(out), rows, layer.out_features,
            layer.in_features, torch.get_num_threads(),
        )  # fmt: skip
        return out

    def _fn(
        self, name: str, dtype: torch.dtype, cache: torch.dtype | None = None
    ) -> Callable[..., None]:
        """The export of ``name`` for ``dtype``, over a KV cache of ``cache`` (``None``:
        the same dtype; bfloat16 or float16 for float32: the ``_bf16kv`` and ``_f16kv``
        exports)."""
        suffix = _SUFFIX[dtype]
        if cache is not None and cache != dtype:
            assert dtype == torch.float32 and cache in _KV_SUFFIX
            suffix += _KV_SUFFIX[cache]
        fn: Callable[..., None] = getattr(self.lib, f"{name}_{suffix}")
        return fn

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """``x``: ``[rows, dim]``, ``weight``: ``[dim]`` -> ``[rows, dim]`` in ``x``'s
        dtype, or in bfloat16 for float32 ``x`` with ``out_dtype=torch.bfloat16`` (the
        product rounded once, as it is stored)."""
        x = x.contiguous()
        rows, dim = x.shape
        args = (rows, dim, eps, torch.get_num_threads())
        if out_dtype is not None and out_dtype != x.dtype:
            assert x.dtype == torch.float32 and out_dtype == torch.bfloat16
            out = torch.empty_like(x, dtype=out_dtype)
            self.lib.rms_norm_f32_bf16(_ptr(x), _ptr(weight), _ptr(out), *args)
            return out
        out = torch.empty_like(x)
        self._fn("rms_norm", x.dtype)(_ptr(x), _ptr(weight), _ptr(out), *args)
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``gate_up``: ``[rows, 2 * inter]`` (gate, then up) -> ``silu(gate) * up``
        ``[rows, inter]``."""
        gate_up = gate_up.contiguous()
        rows, width = gate_up.shape
        out = gate_up.new_empty((rows, width // 2))
        self._fn("silu_mul", gate_up.dtype)(
            _ptr(gate_up), _ptr(out), rows, width // 2, torch.get_num_threads()
        )
        return out

    def sample_rows(
        self, logits: torch.Tensor, inv_temps: torch.Tensor, uniforms: torch.Tensor
    ) -> torch.Tensor:
        """One token id per row (int64 ``[rows]``) drawn from ``softmax(logits[r] *
        inv_temps[r])`` by ``uniforms[r]`` in [0, 1) (inverse CDF, ``sample_row`` in
        ops.h). ``logits``: float32 ``[rows, vocab]``; ``inv_temps`` float32 and
        ``uniforms`` float64, ``[rows]``."""
        logits = logits.contiguous()
        rows, vocab = logits.shape
        out = torch.empty(rows, dtype=torch.int64)
        self.lib.sample_rows_f32(
            _ptr(logits), _ptr(inv_temps.contiguous()), _ptr(uniforms.contiguous()),
            _ptr(out), rows, vocab, torch.get_num_threads(),
        )  # fmt: skip
        return out

    def rope_store(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        heads: int,
        return_k: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``qkv``: ``[n, (heads + 2 * kv_heads) * head_dim]``; ``positions``, ``slots``
        (``block * block_size + offset``): ``[n]``; ``cos``/``sin``: ``[max_len,
        head_dim]``; ``k_cache``: ``[kv_heads, num_blocks, head_dim, block_size]``;
        ``v_cache``: ``[kv_heads, num_blocks, block_size, head_dim]``; ``head_dim <= 512``.
        Writes K (rotated) and V at ``slots``; returns the rotated queries ``[n, heads,
        head_dim]`` and, with ``return_k``, the rotated keys ``[n, kv_heads, head_dim]``.
        The caches may be bfloat16 or float16 for float32 ``qkv``: K and V are rounded as stored,
        and the keys returned are as the cache holds them."""
        qkv = qkv.contiguous()
        n = qkv.shape[0]
        kv_heads, num_blocks, hd, bs = k_cache.shape
        q = qkv.new_empty((n, heads, hd))
        k = qkv.new_empty((n, kv_heads, hd)) if return_k else None
        self._fn("rope_store", qkv.dtype, k_cache.dtype)(
            _ptr(qkv), _ptr(positions), _ptr(cos), _ptr(sin), _ptr(slots), _ptr(k_cache),
            _ptr(v_cache), _ptr(q), 0 if k is None else _ptr(k), n, heads, kv_heads, hd,
            num_blocks, bs, torch.get_num_threads(),
        )  # fmt: skip
        return q, k

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        tables: torch.Tensor,
        seqs: torch.Tensor,
        lens: torch.Tensor,
        max_len: int,
        scale: float,
    ) -> torch.Tensor:
        """``q``: ``[n, heads, head_dim]``; caches as in ``rope_store``; ``tables``:
        ``[num_seqs, max_blocks]`` block ids; ``seqs``: ``[n]`` the row of ``tables`` of
        each query; ``lens``: ``[n]`` keys each query sees (positions ``0 .. lens - 1``),
        each in ``1 .. max_len``. Returns ``[n, heads, head_dim]``. The caches may be
        bfloat16 or float16 for float32 ``q`` (read as float32)."""
        q = q.contiguous()
        n, heads, hd = q.shape
        kv_heads, num_blocks, _, bs = k_cache.shape
        out = torch.empty_like(q)
        self._fn("paged_attention", q.dtype, k_cache.dtype)(
            _ptr(q), _ptr(k_cache), _ptr(v_cache), _ptr(tables), _ptr(seqs), _ptr(lens),
            _ptr(out), n, heads, kv_heads, hd, num_blocks, bs, tables.shape[1], max_len,
            scale, torch.get_num_threads(),
        )  # fmt: skip
        return out

    def has_tile_attention(self, head_dim: int, group: int, block_size: int) -> bool:
        """Whether ``tile_attention`` runs here for this shape (``group``: query heads
        per KV head): AMX tiles this process may use, and a shape the kernel takes."""
        return self.has_tile_linear and bool(
            self.lib.tile_attention_supports(head_dim, group, block_size)
        )

    def tile_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        tables: torch.Tensor,
        runs: torch.Tensor,
        out: torch.Tensor,
        scale: float,
    ) -> None:
        """Causal attention of prompt chunks on AMX tiles (``csrc/tile_attention.h``),
        written into their rows of ``out`` (the other rows untouched). ``q``, ``out``:
        bfloat16 ``[n, heads, head_dim]``; bfloat16 caches as in ``rope_store``, holding
        each chunk's own K and V already; ``runs``: ``[r, 4]`` (first row, rows, row of
        ``tables``, position of the first row), disjoint. Needs ``has_tile_attention``."""
        q = q.contiguous()
        _, heads, hd = q.shape
        kv_heads, num_blocks, _, _ = k_cache.shape
        self.lib.tile_attention_bf16(
            _ptr(q), _ptr(k_cache), _ptr(v_cache), _ptr(tables), _ptr(runs), runs.shape[0],
            _ptr(out), heads, kv_heads, hd, num_blocks, tables.shape[1], scale,
            torch.get_num_threads(),
        )  # fmt: skip


log = logging.getLogger(__name__)
_lock = threading.Lock()
_loaded: dict[tuple[Path, str], Kernels | None] = {}


def _bind(lib: ctypes.CDLL, variant: kernel_build.Variant) -> Kernels:
    """Declare the library's C signatures and wrap it."""
    for name, argtypes in _SIGNATURES.items():
        for suffix in _SUFFIX.values():
            fn = getattr(lib, f"{name}_{suffix}")
            fn.argtypes, fn.restype = argtypes, None
    for name, argtypes in _COMPACT_SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, None
    # The float32 model's bfloat16 outputs (bfloat16 matmuls) and 16-bit KV caches.
    exports = [("rms_norm", "rms_norm_f32_bf16")]
    for kv in _KV_SUFFIX.values():
        exports += [
            ("rope_store", f"rope_store_f32{kv}"),
            ("paged_attention", f"paged_attention_f32{kv}"),
        ]
    for name, export in exports:
        fn = getattr(lib, export)
        fn.argtypes, fn.restype = _SIGNATURES[name], None
    lib.sample_rows_f32.argtypes = [_P] * 4 + [_I] * 2 + [ctypes.c_int]
    lib.sample_rows_f32.restype = None
    for name in ("decode_stack_f32", *(f"decode_stack_f32{kv}" for kv in _KV_SUFFIX.values())):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = _STACK_SIGNATURE, None
    tiles = False
    if variant.has_tiles:
        lib.tile_linear_bf16.argtypes, lib.tile_linear_bf16.restype = _TILE_LINEAR_SIGNATURE, None
        lib.decode_stack_bf16_tiles.argtypes = _STACK_SIGNATURE
        lib.decode_stack_bf16_tiles.restype = None
        lib.tile_linear_available.argtypes, lib.tile_linear_available.restype = [], ctypes.c_int
        lib.tile_gated_silu_bf16.argtypes = [_P] * 3 + [_I] * 3 + [ctypes.c_int]
        lib.tile_gated_silu_bf16.restype = None
        lib.tile_attention_bf16.argtypes = _TILE_ATTENTION_SIGNATURE
        lib.tile_attention_bf16.restype = None
        lib.tile_attention_supports.argtypes = [_I] * 3
        lib.tile_attention_supports.restype = ctypes.c_int
        tiles = bool(lib.tile_linear_available())
    return Kernels(lib, variant=variant.name, has_tile_linear=tiles)


def load_kernels(
    cache_dir: Path, features: CpuFeatures | None = None, variant: str | None = None
) -> Kernels | None:
    """The CPU kernels of the highest variant this CPU runs (or of ``variant``, else
    ``$ORCHESTRATOR_CPU_ISA``'s), prebuilt or built on first use; where a variant cannot
    be built or loaded, the next lower one. ``None`` when none can (no compiler), in which
    case callers use torch ops. Raises ``ValueError`` for a variant this CPU cannot run.
    Loaded once per process, cache folder and variant."""
    features = detect() if features is None else features
    chosen = kernel_build.select_variant(features, variant)
    candidates = kernel_build.runnable(features)
    with _lock:
        for variant in candidates[candidates.index(chosen) :]:
            key = (cache_dir, variant.name)
            if key not in _loaded:
                _loaded[key] = _load(variant, cache_dir)
            if _loaded[key] is not None:
                return _loaded[key]
    log.warning("CPU kernels unavailable; the torch executor uses torch ops")
    return None


def _load(variant: kernel_build.Variant, cache_dir: Path) -> Kernels | None:
    try:
        return _bind(ctypes.CDLL(str(kernel_build.find(variant, cache_dir))), variant)
    except (OSError, subprocess.SubprocessError, AttributeError) as err:
        detail = getattr(err, "stderr", b"") or b""
        log.warning(
            "CPU kernels variant %s unavailable (%s%s)",
            variant.name,
            err,
            f": {detail.decode(errors='replace')[-500:]}" if detail else "",
        )
        return None
