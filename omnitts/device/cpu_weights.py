"""CPU weight preparation: the LMs' linear layers pre-packed for oneDNN once, at load time.

At batch 1 every frame streams all talker weights once and all code-predictor weights 15 times,
so a frame is bound by how fast a matrix-vector product reads its weights. torch's default CPU
linear in float32 calls a GEMM that streams a plain row-major weight at roughly half this
machine's read bandwidth; oneDNN's inner-product kernel over a weight reordered into its blocked
layout reads it about 1.6x faster in float32 and 1.3x faster in bfloat16, and stays ahead up to
batch 64 in float32 (measured on an AVX-512 EPYC, see README "Speed"). The reorder is a one-time
copy, so `pack_linears` swaps each `nn.Linear` for a `PackedLinear` holding only the packed weight.

The packed kernel sums in another order than the default GEMM, so float32 results differ in the
last bits (about 1e-7 relative); greedy codes are unaffected on the parity checkpoints, which the
parity test proves against the official package. `OMNITTS_PACK=0` turns packing off.
"""

from __future__ import annotations

import os

import torch
from torch import nn

PACKED_DTYPES = (torch.float32, torch.bfloat16)


def can_pack(dtype: torch.dtype) -> bool:
    """Whether linear layers of `dtype` are packed on this CPU (oneDNN present, dtype supported)."""
    if os.environ.get("OMNITTS_PACK", "1") == "0" or dtype not in PACKED_DTYPES:
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear(nn.Module):
    """`nn.Linear` whose weight lives in oneDNN's blocked layout (same shape, dtype and results)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().to(dtype or linear.weight.dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)  # 1: the layout tuned for GEMV
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def pack_linears(module: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Replace every `nn.Linear` under `module` by a `PackedLinear` (weights converted to `dtype`
    first, one at a time), in place; returns how many."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child, dtype))
                count += 1
    return count
