"""CPU weight preparation: the LMs' linear layers pre-packed once, at load time.

At batch 1 every frame streams all talker weights once and all code-predictor weights 15 times,
so a frame is bound by how fast a matrix-vector product reads its weights. torch's default CPU
linear in float32 calls a GEMM that streams a plain row-major weight at roughly half this
machine's read bandwidth. `PackedLinear` lays the weight out once for a faster kernel: omnitts' own
(`native.py`, 16-column panels, built on the machine on first use), which reads float32 weights
about 1.4x faster than oneDNN's packed inner product at batch 1 and stays ahead up to batch 32, in
float32 and bfloat16; or, where it cannot be built, oneDNN's inner product over a weight reordered
into its blocked layout (1.6x torch's default in float32, 1.3x in bfloat16). oneDNN's layout depends
on the batch it is tuned for; every engine gets the batch-32 one (`layout_batch`: the batch-1 one is not
row-invariant).
The reorder is a one-time copy, so `pack_linears` swaps each `nn.Linear` for a `PackedLinear`
holding only the packed weight.

The codec's convolutions get the same treatment in cpu_convs.py.

Attention (`use_cpu_attention`) is computed in float32, bfloat16 models included (torch's bfloat16 CPU
attention kernel is the slow one there, see models/layers.float32_attention), and one query per row
(every engine step) by omnitts' own decode kernel where it builds (`native_attention`, which reads a
bfloat16 model's K/V history in bfloat16).

Both packed kernels sum in another order than the default GEMM, so float32 results differ in the
last bits (about 1e-7 relative); greedy codes are unaffected on the parity checkpoints, which the
parity test proves against the official package. `OMNITTS_NATIVE=0` keeps oneDNN; `OMNITTS_PACK=0`
turns packing off altogether.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from ..models.codec import SnakeBeta
from ..models.layers import (
    Attention,
    DecoderStack,
    GatedMLP,
    RMSNorm,
    concat_biases,
    float32_attention,
)
from . import native
from .hugepages import HugePageArena

PACKED_DTYPES = (torch.float32, torch.bfloat16)
PANEL = 16  # outputs per panel of omnitts' packed weight
# The K/V history dtypes omnitts' decode attention kernel reads as stored (bfloat16 widened as read).
ATTENTION_KV_DTYPES = (torch.float32, torch.bfloat16)


def _packing_on(dtype: torch.dtype) -> bool:
    """Packing is not turned off (`OMNITTS_PACK=0`) and `dtype` is one that packs."""
    return os.environ.get("OMNITTS_PACK", "1") != "0" and dtype in PACKED_DTYPES


def can_pack(dtype: torch.dtype) -> bool:
    """Whether linear layers of `dtype` are packed on this CPU (the native kernel or oneDNN runs it)."""
    return _packing_on(dtype) and (native.available(dtype) or onednn_packs(dtype))


def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN's packed kernels run `dtype` on this CPU (present in torch, dtype supported)."""
    if not _packing_on(dtype):
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear(nn.Module):
    """`nn.Linear` whose weight lives in oneDNN's blocked layout (same shape, dtype and results).

    Given several linears of one input size, it is their concatenation (outputs side by side), the
    packing counterpart of `layers.concat_linears`: the parts are widened straight into one buffer.
    """

    def __init__(self, linear: nn.Linear | list[nn.Linear], dtype: torch.dtype | None = None, batch: int = 1,
                 widen: "Widener | None" = None, arena: HugePageArena | None = None):
        super().__init__()
        parts = linear if isinstance(linear, list) else [linear]
        self.in_features = parts[0].in_features
        self.out_features = sum(m.out_features for m in parts)
        dtype = dtype or parts[0].weight.dtype
        weights = [m.weight.detach() for m in parts]
        # omnitts' own kernel where it builds on this machine (bfloat16 pairs need an even width).
        self.native = native.available(dtype) and (dtype == torch.float32 or self.in_features % 2 == 0)
        if self.native:
            # float32 from bfloat16-stored weights (as published): the kernel widens them as it reads
            # (exact), so they are kept in bfloat16, half the bytes to read per frame and to pack.
            narrow = dtype == torch.float32 and all(w.dtype == torch.bfloat16 for w in weights)
            stored = torch.bfloat16 if narrow else dtype
            weight = (widen or Widener())(weights, stored)
            out = arena.empty(packed_shape(self.out_features, self.in_features, stored), stored) if arena else None
            packed = torch.ops.omnitts.pack_linear(weight, dtype, out)
        else:
            weight = (widen or Widener())(weights, dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, layout_batch(batch))
        self.weight = nn.Parameter(packed, requires_grad=False)
        bias = concat_biases(parts)
        self.bias = bias if bias is None or bias.dtype == dtype else nn.Parameter(bias.detach().to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native:
            return torch.ops.omnitts.linear(x, self.weight, self.out_features, self.bias)
        if x.numel() == self.in_features:  # one row: see `ONE_ROW`
            two = x.reshape(1, self.in_features).expand(ONE_ROW, self.in_features).contiguous()
            out = torch.ops.mkldnn._linear_pointwise(two, self.weight, self.bias, "none", [], "")
            return out[:1].reshape(*x.shape[:-1], self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        kernel = "native" if self.native else "oneDNN"
        return f"in_features={self.in_features}, out_features={self.out_features}, packed for {kernel}"


def packed_shape(out_features: int, in_features: int, stored: torch.dtype) -> tuple[int, int]:
    """The shape of omnitts' packed weight (`native_kernels.cpp`, pack_linear): panels of 16 outputs, each
    [K][16], bfloat16 ones in (k, k + 1) pairs with K rounded up to even."""
    depth = in_features + in_features % 2 if stored == torch.bfloat16 else in_features
    return -(-out_features // PANEL), depth * PANEL


def layout_batch(batch: int) -> int:
    """The batch size oneDNN lays a packed weight out for: 32, whatever the engine's largest batch.

    A row's result must not depend on its batch, nor on the engine's `max_batch` (docs/architecture.md,
    determinism). oneDNN's batch-1 layout breaks both in float32: a row computed alone differs in its
    last bits from the same row in a batch of 2 or more (measured, torch 2.13 on an AVX-512 EPYC,
    tests/test_invariance.py), and an engine of max_batch 1 would pack differently from one of 6.
    The batch-32 layout gives every row the same bits at any batch (bfloat16: both layouts do).
    Measured on that EPYC (0.6B engine step, float32): the batch-1 layout gave 398 ms at batch 1 but
    686 ms at batch 8, the batch-32 one 450 ms and 462 ms (958 instead of 1082 at batch 32), so a
    batch-1 engine on this fallback path pays ~13% for determinism; omnitts' native kernel, the
    default, is row-invariant and unaffected.
    """
    return LAYOUT_BATCH


LAYOUT_BATCH = 32

# oneDNN computes a one-row call with a kernel of its own, which on some CPUs sums in another order than
# the kernel of two rows or more: measured on a Xeon with AMX (torch 2.4.1 and 2.13), a row's bfloat16
# result alone differed from the same row among others for input widths 32, 40, 48 and 72 (not 64, 80,
# 96, 1024: 0 of 100 rows), and a float32 call with a bias (1024 -> 2048) differed in every row. A
# one-row call therefore runs as two copies of the row (weight-bound at one row, so about the same time).
# Between 2 and 32 rows each row's bits were the same; above 32 rows that CPU's bfloat16 kernel changes
# again (33-36 rows, then 37 and more), which only an engine of --max-batch above 32 on this fallback
# meets (docs/architecture.md, determinism).
ONE_ROW = 2


def pack_linears(module: nn.Module, dtype: torch.dtype | None = None, batch: int = 1,
                 widen: "Widener | None" = None, arena: HugePageArena | None = None) -> int:
    """Replace every `nn.Linear` under `module` by a `PackedLinear` (weights converted to `dtype`
    first, one at a time, in `widen`'s buffer; laid out for calls of up to `batch` rows; omnitts' own
    packed weights placed in `arena` where given), in place; returns how many."""
    widen = widen or Widener()
    return swap_modules(module, lambda m: type(m) is nn.Linear, lambda m: PackedLinear(m, dtype, batch, widen, arena))


class Widener:
    """Converts weights to the packing dtype in one reused buffer (`__call__(weights, dtype)`: one
    weight, or several of one width stacked by rows).

    The reorder copies what it reads, so the converted weight is only a temporary; a fresh one per
    weight would fault in new pages every time (measured on a 4 KiB-page VM: widening the 0.6B
    model's bfloat16-stored linears to float32 took 1.4-2.7 s that way, nearly all page faults)."""

    def __init__(self):
        self.buffers: dict[torch.dtype, torch.Tensor] = {}

    def __call__(self, weights: torch.Tensor | list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        if isinstance(weights, torch.Tensor):
            weights = [weights]
        if len(weights) == 1 and weights[0].dtype == dtype:
            return weights[0]
        rows = sum(w.shape[0] for w in weights)
        numel = rows * weights[0].shape[1]
        buffer = self.buffers.get(dtype)
        if buffer is None or buffer.numel() < numel:
            buffer = self.buffers[dtype] = torch.empty(numel, dtype=dtype)
        out = buffer[:numel].view(rows, weights[0].shape[1])
        start = 0
        for w in weights:
            out[start : start + w.shape[0]].copy_(w)
            start += w.shape[0]
        return out


def use_cpu_attention(module: nn.Module) -> int:
    """Give every decoder stack under `module` the CPU attention kernel; returns how many stacks (calls
    that pass their own kernel, like the NPU predictor's, keep it).

    The kernel is `native_attention` where the native kernels build: it computes in float32 and widens
    a bfloat16 K/V history as it reads it (exact), so bfloat16 models keep their K/V in bfloat16, half
    the bytes to read each step. Elsewhere `layers.float32_attention`, with a float32 K/V history
    (`kv_dtype`: widened once, on write, not at every step). float32 for bfloat16 models, measured on
    an AVX-512 EPYC, torch 2.13, one query per row over 17-36 keys: torch's bfloat16 CPU attention took
    1.3-2.9 ms per call at batch 32 against 0.3-0.6 ms in float32 (103 calls per 0.6B frame), 61
    against 19 us at batch 1."""
    stacks = [m for m in module.modules() if isinstance(m, DecoderStack)]
    native_kernel = native.available(torch.float32)
    for stack in stacks:
        stack.attend = native_attention if native_kernel else cpu_attention
        # Histories the kernel does not read (float16) are widened once, on write.
        read_as_stored = native_kernel and stack.norm.weight.dtype in ATTENTION_KV_DTYPES
        stack.kv_dtype = None if read_as_stored else torch.float32
    return len(stacks)


def native_attention(q, k, v, mask, causal: bool) -> torch.Tensor:
    """`layers.float32_attention`, with omnitts' decode kernel taking the calls of one query per row
    (every engine step's: the talker's and the code predictor's after its first position), over a
    float32 or bfloat16 K/V history (widened as read: the float32 result of the widened history).

    torch's CPU kernel works one (row, head) at a time and read the talker's K/V at ~8 GB/s at batch
    32; the native one takes a row's KV head once for all the query heads it serves, in registers.
    Measured (AVX-512 EPYC, 2 threads, 16 query and 8 KV heads of 128, float32 K/V): batch 32 over 17
    / 70 / 150 / 250 keys 0.13 / 0.71 / 1.69 / 2.64 ms (omnitts' first, scalar kernel; torch's took
    about 2x that) -> 0.07 / 0.40 / 1.24 / 2.07, with a bfloat16 history 0.07 / 0.24 / 0.74 / 1.08;
    batch 8 over 150 keys 0.25 -> 0.09, batch 1 0.036 -> 0.017. Same results within float rounding
    (another summation order), and a row's result does not depend on its batch."""
    if (q.shape[2] == 1 and k.dtype == v.dtype and k.dtype in ATTENTION_KV_DTYPES and _rows_contiguous(k)
            and _rows_contiguous(v) and _one_row_mask(mask, k.shape[2])):
        out = torch.ops.omnitts.decode_attention(q.float(), k, v, mask, q.shape[-1] ** -0.5)
        return out.to(q.dtype)
    return cpu_attention(q, k, v, mask, causal)


def cpu_attention(q, k, v, mask, causal: bool) -> torch.Tensor:
    """`layers.float32_attention`, with the calls of one query per row (every talker step, the code
    predictor's after its first position) taken by `chunked_decode_attention`, whose rows do not depend
    on their batch: the CPU kernel where the native one does not build, and the native one's fallback.
    torch's sdpa is not row-invariant there, even without a mask (two threads, float32, 8 keys: a
    predictor row differed alone and in a batch of 2, tests/test_invariance.py)."""
    if q.shape[2] == 1 and _one_row_mask(mask, k.shape[2]):
        return chunked_decode_attention(q, k, v, mask).to(q.dtype)
    return float32_attention(q, k, v, mask, causal)


KEY_CHUNK = 64  # keys per fixed-shape product in `chunked_decode_attention`


def chunked_decode_attention(q, k, v, mask) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for one query per row, in float32, a row's result bitwise independent
    of the other rows and of how many keys the batch spans: q (B, H, 1, D), k/v (B, Hkv, S, D), `mask`
    boolean (B|1, 1, 1, S), True = attend, or None (every key).

    torch's sdpa reduces over all S keys of the call, and S is the longest row's length: a row's sums
    then round differently alone and next to a longer row (issue 35, bfloat16 codes that changed with
    --max-batch). Here the keys go in chunks of KEY_CHUNK, each chunk one product of a fixed shape (the
    last one zero-padded), so a row's chunk products are the same whatever follows; the softmax (over
    -inf past the row's length, which adds exact zeros) and the sum of the chunks' partial outputs add
    a longer batch's extra keys as exact zeros. Checked bitwise by tests/test_invariance.py.
    """
    b, h, _, d = q.shape
    hkv, keys = k.shape[1], k.shape[2]
    g, c = h // hkv, KEY_CHUNK
    full = keys // c * c
    q = q.float().reshape(b, hkv, 1, g, d).contiguous()
    k, v = k.float(), v.float()
    # Whole chunks, then the rest (under one chunk) zero-padded. Contiguous copies: torch's batched
    # products over strided views of the slot cache (rows `capacity` apart) took another path whose
    # rounding depended on the batch's span (measured, torch 2.13, two threads).
    k_parts = [k[:, :, :full].reshape(b, hkv, full // c, c, d).contiguous()] if full else []
    v_parts = [v[:, :, :full].reshape(b, hkv, full // c, c, d).contiguous()] if full else []
    if mask is None:
        mask = torch.ones((1, 1, 1, keys), dtype=torch.bool, device=q.device)
    if full < keys:
        pad = (0, 0, 0, c - (keys - full))
        k_parts.append(F.pad(k[:, :, full:], pad)[:, :, None])
        v_parts.append(F.pad(v[:, :, full:], pad)[:, :, None])
        mask = F.pad(mask, (0, c - (keys - full)), value=False)
    n = sum(part.shape[2] for part in k_parts)
    scores = torch.cat([torch.matmul(q, part.transpose(-1, -2)) for part in k_parts], dim=2)  # (B, Hkv, n, G, C)
    scores = scores.transpose(2, 3).reshape(b, hkv, g, n * c).mul_(d ** -0.5)
    scores.masked_fill_(~mask.reshape(mask.shape[0], 1, 1, n * c), float("-inf"))
    # Contiguous: strided operands would send the products down another path than a lone chunk's.
    p = torch.softmax(scores, dim=-1).view(b, hkv, g, n, c).transpose(2, 3).contiguous()  # (B, Hkv, n, G, C)
    outs, start = [], 0
    for part in v_parts:
        outs.append(torch.matmul(p[:, :, start:start + part.shape[2]], part))  # (B, Hkv, n_i, G, D)
        start += part.shape[2]
    return torch.cat(outs, dim=2).sum(2).reshape(b, h, 1, d)


def _rows_contiguous(t: torch.Tensor) -> bool:
    return t.dim() == 4 and t.stride(3) == 1 and (t.shape[2] <= 1 or t.stride(2) == t.shape[3])


def _one_row_mask(mask: torch.Tensor | None, keys: int) -> bool:
    """None, or a boolean (B|1, 1, 1, keys) mask: what the decode kernel takes."""
    return mask is None or (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1:] == (1, 1, keys))


def use_native_norms(module: nn.Module, dtype: torch.dtype) -> int:
    """Give every `RMSNorm` of `dtype` under `module` omnitts' fused CPU kernel (one pass instead of
    six kernels, the same roundings; see native_kernels.cpp), where it is built; returns how many.
    A 0.6B frame runs ~325 norms over 128-1024 values, each six small kernels otherwise."""
    return _use_kernel(module, RMSNorm, dtype, torch.ops.omnitts.rms_norm if native.available(dtype) else None)


def use_native_rope(module: nn.Module, dtype: torch.dtype) -> int:
    """Give every fused `Attention` of `dtype` under `module` omnitts' q/k norm-and-rotate kernel (one
    pass over the q and k heads instead of about eight small kernels, bitwise their result), where it is
    built; returns how many. The 0.6B engine runs it ~100 times a frame (talker and code predictor
    layers): ~69 -> ~15 us a call at batch 8 (measured, bfloat16)."""
    if not native.available(dtype):
        return 0
    found = [m for m in module.modules() if isinstance(m, Attention) and m.qk_norm is not None
             and m.qk_norm.weight.dtype == dtype]
    for m in found:
        m.rope_kernel = torch.ops.omnitts.norm_rope
    return len(found)


def use_native_swiglu(module: nn.Module, dtype: torch.dtype) -> int:
    """Give every fused `GatedMLP` under `module`, a model computing in `dtype`, omnitts' silu(gate) * up
    kernel (one pass instead of three kernels, bitwise torch's AVX-512 arithmetic, hence only where torch
    runs its AVX-512 kernels); returns how many. 0.6B, batch 8, bfloat16: ~25 -> ~13 us a call, ~100 calls
    a frame (measured)."""
    usable = (native.available(dtype) and native.vectorised_float32()
              and torch.backends.cpu.get_cpu_capability() == "AVX512")
    if not usable:
        return 0
    found = [m for m in module.modules() if isinstance(m, GatedMLP) and m.gate_up_proj is not None]
    for m in found:
        m.kernel = torch.ops.omnitts.silu_mul
    return len(found)


def use_native_snakes(module: nn.Module, dtype: torch.dtype, parity: bool = False) -> int:
    """Give every codec `SnakeBeta` of `dtype` under `module` omnitts' fused CPU kernel, where it is built;
    returns how many. bfloat16: one pass instead of five, each a conversion to float32 and back, bitwise
    torch's result, sine included (~1.25x measured). float32 (AVX-512 builds), unless `parity` (a float32
    run's codec, which keeps torch's arithmetic as Winograd's rule does): one pass instead of three, with
    SLEEF's 3.5-ulp sine where torch calls MKL's, ~1e-7 relative apart (0.6B shapes, isolated: the
    codec's SnakeBetas 1.45 -> 0.28 ms per frame)."""
    fused_float32 = dtype == torch.float32 and not parity and native.vectorised_float32()
    usable = native.available(dtype) and (dtype == torch.bfloat16 or fused_float32)
    return _use_kernel(module, SnakeBeta, dtype, torch.ops.omnitts.snake if usable else None)


def _use_kernel(module: nn.Module, kind: type, dtype: torch.dtype, kernel) -> int:
    if kernel is None:
        return 0
    found = [m for m in module.modules() if isinstance(m, kind) and next(m.parameters()).dtype == dtype]
    for m in found:
        m.kernel = kernel
    return len(found)


def swap_modules(module: nn.Module, wanted, make) -> int:
    """Replace every submodule `m` of `module` with `wanted(m)` by `make(m)`, in place; returns how many."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if wanted(child):
                setattr(parent, name, make(child))
                count += 1
    return count
