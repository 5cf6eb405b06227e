"""``y = x @ W.T`` with the weight reordered once into oneDNN's blocked layout.

``F.linear`` on CPU reorders the weight for oneDNN (bfloat16) or calls MKL (float32) on
every call. Packing once at load time and calling oneDNN's linear directly ran 2-3x
faster at decode sizes (1-64 rows) and 15-60% faster at prefill sizes (512 rows) on
this project's machines, with bit-identical bfloat16 results and float32 results within
~1e-6. Where oneDNN is unavailable the dense weight is kept and ``F.linear`` is used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# oneDNN picks its blocking from an expected row count; 64 was as fast as the best
# choice from 1 to 512 rows in both dtypes.
_ROWS_HINT = 64


class Linear:
    """A bias-free linear layer over ``weight``: ``[out_features, in_features]``."""

    def __init__(self, weight: torch.Tensor, pack: bool = True) -> None:
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self._packed: torch.Tensor | None = None
        self._dense: torch.Tensor | None = weight
        if pack and torch.backends.mkldnn.is_available():
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, _ROWS_HINT)
            self._dense = None  # the packed copy replaces it; keep one copy in memory

    @property
    def num_bytes(self) -> int:
        return (
            self.out_features * self.in_features * torch.empty((), dtype=self.dtype).element_size()
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[rows, in_features]`` -> ``[rows, out_features]``."""
        if self._packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
        assert self._dense is not None
        return F.linear(x, self._dense)
