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

The codec's transposed convolutions get the same treatment (`pack_transposed_convs`): torch's
`conv_transpose1d` reorders its weight into oneDNN's layout on every call (75 MB for the 0.6B
codec's first upsampling block), which at streaming chunk sizes costs more than the arithmetic.
There the kernel is the one torch calls anyway, so results are unchanged (bitwise, measured), in
float32 and, for a codec loaded in bfloat16, in bfloat16. Except the late, small ones in float32:
with many positions per call and a small weight, oneDNN's transposed convolution runs far below
the GEMM's rate, so those become one GEMM and an overlap-add (`GemmConvTranspose1d`). The biggest
plain convolution (the decoder's first, 44 MB over 4 positions per frame) keeps a reordered weight
too (`PackedConv1d`, `pack_convs`): torch's `conv1d` reorders it on every call. In bfloat16 runs the
float32 codec's convolutions take fewer multiplications instead (`winograd_convs`, before the packing,
which takes what is left): Winograd's F(6, 7) for the kernel-7 ones (`WinogradConv1d`), F(3, 2) over
the polyphase form of the transposed ones (`WinogradConvTranspose1d`), transforms omnitts' kernels.

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

from ..models.codec import ResidualUnit, SnakeBeta
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
    return _swap(module, lambda m: type(m) is nn.Linear, lambda m: PackedLinear(m, dtype, batch, widen, arena))


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


def _swap(module: nn.Module, wanted, make) -> int:
    """Replace every submodule `m` of `module` with `wanted(m)` by `make(m)`, in place; returns how many."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if wanted(child):
                setattr(parent, name, make(child))
                count += 1
    return count


class PackedConvTranspose1d(nn.Module):
    """`nn.ConvTranspose1d` (no padding, groups 1) whose weight is reordered for oneDNN once.

    Keeps the attributes callers read (`in_channels`, `out_channels`, `kernel_size`, `stride`)."""

    def __init__(self, conv: nn.ConvTranspose1d):
        super().__init__()
        assert conv.padding == (0,) and conv.output_padding == (0,) and conv.groups == 1, conv
        assert conv.dilation == (1,), conv
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride = conv.kernel_size, conv.stride
        # Viewed as a 2-D convolution over a height of 1, the form oneDNN's kernels take.
        weight = conv.weight.detach()[:, :, None, :]
        packed = torch.ops.mkldnn._reorder_convolution_transpose_weight(
            weight, [0, 0], [0, 0], [1, self.stride[0]], [1, 1], 1, None)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.bias = conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T) -> (B, C', (T - 1) * stride + kernel)
        y = torch.ops.mkldnn._convolution_transpose_pointwise(
            x.contiguous()[:, :, None, :], self.weight, self.bias, [0, 0], [0, 0], [1, self.stride[0]],
            [1, 1], 1, "none", [], "")
        return y[:, :, 0, :].contiguous()  # oneDNN answers channels-last

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, packed")


class GemmConvTranspose1d(nn.Module):
    """`nn.ConvTranspose1d` (no padding, groups 1, kernel a multiple m of the stride s) as one GEMM
    and an overlap-add.

    Input position t adds m * s outputs from t * s on: the GEMM x^T (B*T, Cin) @ W (Cin, Cout*m*s)
    gives every position's m pieces of s at once, and output block u (samples u*s .. u*s + s - 1) is
    the bias plus piece h of input u - h, for h < m. Same results as the convolution within float
    rounding (another summation order). Keeps the attributes callers read."""

    def __init__(self, conv: nn.ConvTranspose1d):
        super().__init__()
        assert conv.padding == (0,) and conv.output_padding == (0,) and conv.groups == 1, conv
        assert conv.dilation == (1,) and conv.kernel_size[0] % conv.stride[0] == 0, conv
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride = conv.kernel_size, conv.stride
        self.weight = nn.Parameter(conv.weight.detach().reshape(conv.in_channels, -1).contiguous(), requires_grad=False)
        self.bias = conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T) -> (B, C', (T - 1) * stride + kernel)
        (B, _, T), s, O = x.shape, self.stride[0], self.out_channels
        m = self.kernel_size[0] // s
        z = torch.mm(x.transpose(1, 2).reshape(B * T, -1), self.weight).view(B, T, O, m, s).permute(0, 2, 1, 3, 4)
        y = x.new_empty(B, O, T + m - 1, s)
        if self.bias is None:
            y.zero_()
        else:
            y.copy_(self.bias.view(1, O, 1, 1).expand_as(y))
        for h in range(m):
            y[:, :, h:h + T] += z[:, :, :, h]
        return y.view(B, O, -1)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, GEMM"


class PackedConv1d(nn.Module):
    """`nn.Conv1d` (no padding, stride 1, groups 1; any dilation) whose weight is reordered for oneDNN
    once: torch's `conv1d` reorders it on every call, which for a big weight over few positions costs
    more than the arithmetic (see `PACKED_CONV_MIN_WEIGHTS`). Same results within float rounding.
    Keeps the attributes callers read (`in_channels`, `out_channels`, `kernel_size`, `dilation`)."""

    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        assert conv.padding == (0,) and conv.stride == (1,) and conv.groups == 1, conv
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.dilation = conv.kernel_size, conv.dilation
        # Viewed as a 2-D convolution over a height of 1, the form oneDNN's kernels take.
        packed = torch.ops.mkldnn._reorder_convolution_weight(
            conv.weight.detach()[:, :, None, :], [0, 0], [1, 1], [1, self.dilation[0]], 1, None)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.bias = conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T) -> (B, C', T - (kernel - 1) * dilation)
        y = torch.ops.mkldnn._convolution_pointwise(
            x.contiguous()[:, :, None, :], self.weight, self.bias, [0, 0], [1, 1], [1, self.dilation[0]], 1,
            "none", [], "")
        return y[:, :, 0, :].contiguous()  # oneDNN answers channels-last

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"dilation={self.dilation}, packed")


# Convs of at least this many weights run as `PackedConv1d` (where oneDNN packs their dtype). Measured
# on an AVX-512 EPYC, 2 threads, float32, one stream's positions per call: the 0.6B codec's first
# decoder conv (1024 -> 1536, kernel 7, 11M weights) 19.7 -> 4.0 ms over 25 positions, 26.3 -> 12.5 over
# 100 (a 25-frame chunk), 97.5 -> 102.1 over 800; its first upsampling block's (768 -> 768, kernel 7,
# 4.1M) 5.1 -> 4.0 over 100 and 30.6 -> 30.2 over 800; but the small late ones lose (96 -> 96, kernel 7,
# 9.4 -> 10.7 ms; 1x1 convs up to 2x slower): their weight is cheap to reorder, and oneDNN's
# channels-last answer costs a copy.
PACKED_CONV_MIN_WEIGHTS = 8 << 20


def pack_convs(module: nn.Module) -> int:
    """Replace every `nn.Conv1d` under `module` with at least `PACKED_CONV_MIN_WEIGHTS` weights, groups
    1, stride 1 and no padding, whose dtype oneDNN packs (`onednn_packs`), by a `PackedConv1d`, in place;
    returns how many (0 where packing is off or unavailable)."""
    def wanted(m):
        return (type(m) is nn.Conv1d and m.weight.numel() >= PACKED_CONV_MIN_WEIGHTS and m.groups == 1
                and m.stride == (1,) and m.padding == (0,) and onednn_packs(m.weight.dtype))

    return _swap(module, wanted, PackedConv1d)


# Winograd F(m, 7): its transforms evaluate at m + 5 finite points, and at infinity. Small points keep
# the transforms' coefficients small. F(3, 7) (the first 8 of WINOGRAD_POINTS): others tried for 3, 1.5,
# -3, 1/4, within 30% the same error. F(4, 7)'s 9th: -1/3 keeps F(3, 7)'s error (per conv against
# float64, 384 / 192 / 96 channels, dilations 1 / 3 / 9: 1.5 / 1.1 / 0.7e-5 of the peak against 1.5 /
# 1.3 / 0.8e-5), where -3 doubled it and 1.5 made it 4-6x. F(5, 7) and F(6, 7) (the default) take
# WINOGRAD_POINTS_6's: +-3/2 and +-2/3 after +-1/2 (a float32 simulation, 384 channels against float64,
# rms relative error: F(4, 7) 4.8e-6, F(6, 7) 9.2e-6; with 3, -1/3, -3, 1/3 instead 9.8e-6, with 1/4, -4
# 10.3e-6; F(8, 7) 2.2-2.8e-5, not used).
WINOGRAD_POINTS = (0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -1 / 3)
WINOGRAD_POINTS_6 = (0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 1.5, -1.5, 2 / 3, -2 / 3)
WINOGRAD_OUTPUTS = 6  # m: outputs per tile, alpha = m + 6 products per tile instead of 7 * m


def winograd_points(m: int) -> tuple:
    """F(m, 7)'s m + 5 finite points (m = 2 to 6)."""
    assert 2 <= m <= 6, m
    return (WINOGRAD_POINTS if m <= 4 else WINOGRAD_POINTS_6)[: m + 5]


def winograd_matrices(m: int, r: int, points) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Toom-Cook matrices (A^T (m x a), G (a x r), B^T (a x a), float64, a = m + r - 1) for the
    correlation y_i = sum_k w_k x_(i+k), i < m: y = A^T ((G w) * (B^T x)).

    The products of a length-m and a length-r polynomial, evaluated at a - 1 finite points and at
    infinity (the leading coefficient), give the a coefficients of their product back through Lagrange
    interpolation; B^T's rows are the interpolation's basis polynomials (the point's own scale moved
    into G), and the correlation is that convolution transposed."""
    a, f64 = m + r - 1, torch.float64
    p = torch.tensor(points, dtype=f64)
    assert p.numel() == a - 1, (m, r, points)

    def coefficients(roots):  # of prod (x - root), ascending powers, padded to a
        c = torch.zeros(a, dtype=f64)
        c[0] = 1.0
        for root in roots:
            c = torch.cat([torch.zeros(1, dtype=f64), c[:-1]]) - root * c
        return c

    at, g, bt = torch.zeros(m, a, dtype=f64), torch.zeros(a, r, dtype=f64), torch.zeros(a, a, dtype=f64)
    for k in range(a - 1):
        others = torch.cat([p[:k], p[k + 1:]])
        at[:, k] = p[k] ** torch.arange(m, dtype=f64)
        g[k] = p[k] ** torch.arange(r, dtype=f64) / torch.prod(p[k] - others)
        bt[k] = coefficients(others)
    at[m - 1, a - 1] = g[a - 1, r - 1] = 1.0
    bt[a - 1] = coefficients(p)
    return at, g, bt


class _Winograd(nn.Module):
    """What both Winograd modules share: F(m, r)'s transforms and its products' weights, each point's
    (Cout, Cin) matrix laid out for oneDNN's inner product once; `_correlate` runs them over a
    channels-last input."""

    def _set_transforms(self, m: int, points, taps: torch.Tensor, bias, exact: torch.dtype = torch.float64) -> None:
        """`taps` (Cout, Cin, r): the correlation y_i = sum_k taps[..., k] x_(i+k) to compute; G's products
        summed in `exact` (float64 unless float32 is already exact for these points), then float32."""
        at, g, bt = winograd_matrices(m, taps.shape[-1], points)
        self.m = m
        cout, cin, r = taps.shape
        points_major = (taps.reshape(-1, r).to(exact) @ g.T.to(exact)).float().T.contiguous()  # (a, Cout * Cin)
        self.weights = nn.ParameterList(
            nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(w.view(cout, cin), layout_batch(32)),
                         requires_grad=False)
            for w in points_major)
        self.register_buffer("at", at.float(), persistent=False)
        self.register_buffer("bt", bt.float(), persistent=False)
        self.bias = bias

    def _correlate(self, x: torch.Tensor, d: int, Q: int, T: int) -> torch.Tensor:
        """x (B, L, Cin) channels-last -> (B, T, Cout): Q tiles per interleaved convolution of dilation d."""
        U = torch.ops.omnitts.wino_input(x, self.bt, self.m, d, Q)  # (a, B*Q*d, Cin)
        M = [torch.ops.mkldnn._linear_pointwise(u, w, None, "none", [], "") for u, w in zip(U, self.weights)]
        return torch.ops.omnitts.wino_output(M, self.at, self.bias, x.shape[0], d, Q, T)


class WinogradConv1d(_Winograd):
    """`nn.Conv1d` of kernel 7 (float32, no padding, stride 1, groups 1; any dilation) by Winograd's
    F(m, 7), m = 6 by default: each tile of 6 outputs is 12 products of transformed inputs and weights
    instead of 42 multiply-adds, 3.5x fewer (F(4, 7): 10 for 28, 2.8x; F(3, 7): 9 for 21, 2.3x).
    Dilation d interleaves d plain convolutions, tiled alike.

    Channels-last inside: the transforms are omnitts' kernels (`wino_input`, `wino_output`: one pass
    each over contiguous channel vectors; `transpose_pad` changes the layout on the way in and out,
    2-5x torch's strided copy); the products are oneDNN inner products over weights laid
    out once, ~190-210 GFLOP/s here where a grouped 1x1 convolution ran ~140-170 and `bmm` ~145.
    Measured on an AVX-512 EPYC, 2 threads, per call over one 25-frame streaming call's positions or
    one 8-frame slice's (direct -> F(3, 7) -> F(4, 7), ms): 768 channels over 800 positions 31.0 ->
    16.4 -> 13.4, 384 over 1280 12.4 -> 7.0 -> 6.3, 192 over 5120 12.4 -> 8.7 -> 8.1, 96 over 15360
    9.7 -> 10.2 -> 9.1 (the transforms weigh more against fewer channels). F(4, 7) -> F(6, 7), the
    transforms costing about the same per output (~24 input terms, 10 -> 12 output terms), products
    and transforms only, min of 5 interleaved calls (dilations 1 / 3 / 9, ms): 768 channels over 800
    positions 14.7 / 14.4 / 14.5 -> 12.5 / 12.0 / 11.8, 384 over 4000 17.7 / 17.8 / 16.9 -> 15.3 / 14.2
    / 13.8, 192 over 16000 20.5 / 21.7 / 21.7 -> 17.4 / 17.6 / 18.4, 96 over 48000 47.0 / 42.0 / 42.0 ->
    36.8 / 37.0 / 35.2; F(5, 7) in between.

    The price is rounding: F(6, 7)'s input transform scales values by up to ~20 (a row's coefficients
    sum to 70) and its output transform the products by up to 32 (82), so the products' float32
    rounding lands ~2x F(4, 7)'s distance from the exact convolution (see `WINOGRAD_POINTS`), which is
    ~3e-5 at unit-scale activations where the direct one is ~8e-7. The 0.6B codec's waveform from
    fixed random codes: 70 dB SNR against the direct decode (max 4.3e-4 of the peak), F(4, 7) 75 dB.
    Hence the loader keeps float32 runs, the parity runs, on the direct convolutions. Keeps the
    attributes callers read."""

    def __init__(self, conv: nn.Conv1d, m: int = WINOGRAD_OUTPUTS):
        super().__init__()
        assert conv.kernel_size == (7,) and conv.padding == (0,) and conv.stride == (1,) and conv.groups == 1, conv
        assert conv.weight.dtype == torch.float32, conv.weight.dtype
        assert native.available(torch.float32), "WinogradConv1d needs omnitts' native kernels"
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.dilation = conv.kernel_size, conv.dilation
        self._set_transforms(m, winograd_points(m), conv.weight.detach(), conv.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, L) -> (B, C', L - 6 * dilation)
        L, d = x.shape[-1], self.dilation[0]
        T = L - 6 * d
        if T <= 0:
            raise ValueError(f"WinogradConv1d: {L} input positions, the kernel spans {6 * d + 1}")
        Q = -(-T // (self.m * d))  # tiles per interleaved convolution
        return torch.ops.omnitts.transpose_pad(self._correlate(torch.ops.omnitts.transpose_pad(x), d, Q, T))

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"dilation={self.dilation}, Winograd F({self.m}, 7)")


# Winograd F(m, 2) for the transposed convs' two-tap polyphase form: the first m points, and infinity.
TRANSPOSED_WINOGRAD_POINTS = (0.0, 1.0, -1.0, 0.5)
TRANSPOSED_WINOGRAD_OUTPUTS = 3


class WinogradConvTranspose1d(_Winograd):
    """`nn.ConvTranspose1d` of kernel 2s for stride s (float32, no padding, groups 1) by Winograd's
    F(m, 2) over its polyphase form.

    Output block u (samples u*s .. u*s + s - 1, u <= T) is A1 x[u - 1] + A0 x[u] + bias, x zero outside
    0..T-1, where A0 and A1 (s * Cout, Cin) are the weight's first and second s taps, phase-major: a
    two-tap convolution from Cin to s * Cout channels over x padded by one zero on each side. Its tile
    of m blocks is m + 1 products instead of 2m (F(3, 2): 1.5x fewer), from points 0, +-1 and infinity
    whose transforms only add and subtract. Channels-last inside, like `WinogradConv1d` (same kernels);
    the answer (B, T + 1, s * Cout) is (B, (T + 1) * s, Cout) as it lies, transposed once."""

    def __init__(self, conv: nn.ConvTranspose1d, m: int = TRANSPOSED_WINOGRAD_OUTPUTS):
        super().__init__()
        s = conv.stride[0]
        assert conv.kernel_size == (2 * s,) and conv.padding == (0,) and conv.output_padding == (0,), conv
        assert conv.groups == 1 and conv.dilation == (1,) and conv.weight.dtype == torch.float32, conv
        assert native.available(torch.float32), "WinogradConvTranspose1d needs omnitts' native kernels"
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride = conv.kernel_size, conv.stride
        # (Cin, Cout, 2s) -> taps (s * Cout, Cin, 2), phase-major: tap 0 is A1 (on x[u - 1]), tap 1 A0 (on x[u])
        w = conv.weight.detach().view(self.in_channels, self.out_channels, 2, s).flip(2)
        taps = w.permute(3, 1, 0, 2).reshape(s * self.out_channels, self.in_channels, 2)
        bias = None if conv.bias is None else nn.Parameter(conv.bias.detach().repeat(s), requires_grad=False)
        # Points 0, +-1 (m <= 3): each of G's rows is one tap or half the sum or difference of two, which
        # float32 rounds once, as float64 then float32 would.
        self._set_transforms(m, TRANSPOSED_WINOGRAD_POINTS[:m], taps, bias,
                             exact=torch.float32 if m <= 3 else torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T) -> (B, C', (T - 1) * stride + kernel)
        (B, _, T), s = x.shape, self.stride[0]
        y = self._correlate(torch.ops.omnitts.transpose_pad(x, 1, 1), 1, -(-(T + 1) // self.m), T + 1)
        return torch.ops.omnitts.transpose_pad(y.view(B, (T + 1) * s, self.out_channels))  # y: (B, T + 1, s * Cout)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, Winograd F({self.m}, 2)")


# Kernel-7 convs with at least this many input and output channels run as `WinogradConv1d` (float32,
# where the native kernels build with AVX-512). The 0.6B / 1.7B codec: the first decoder conv (1024 ->
# 1536) and all 12 kernel-7 convs of its residual units (768, 384, 192, 96 channels). The 96-channel
# ones gain least (one 8-frame slice of 15360 positions: direct 9.65 ms, F(4, 7) 9.1; F(3, 7) lost,
# 10.2); narrower ones are not measured.
WINOGRAD_MIN_CHANNELS = 96


def _rounding_allowed(parity: bool) -> bool:
    """Whether a codec may take another summation order than torch's: not in parity runs, unless
    `OMNITTS_WINOGRAD` says so (`0` never, `1` parity runs too)."""
    switch = os.environ.get("OMNITTS_WINOGRAD")
    return switch != "0" and (not parity or switch == "1")


def winograd_convs(module: nn.Module, parity: bool = False) -> int:
    """Replace, in place, every float32 kernel-7 `nn.Conv1d` under `module` with groups 1, stride 1 and
    no padding by a `WinogradConv1d`, and every float32 `nn.ConvTranspose1d` of kernel 2s for stride s
    (groups 1, no padding) by a `WinogradConvTranspose1d`, those with at least `WINOGRAD_MIN_CHANNELS`
    in and out, where the native kernels build with AVX-512 and oneDNN packs float32; returns how
    many. Call it before `pack_convs` / `pack_transposed_convs`, which take what is left. `parity` (a
    float32 run's codec) keeps the direct convolutions, Winograd's rounding not being parity's;
    `OMNITTS_WINOGRAD` overrides: `0` never, `1` parity runs too."""
    if not _rounding_allowed(parity):
        return 0
    if not (native.available(torch.float32) and onednn_packs(torch.float32) and native.vectorised_float32()):
        return 0

    def wanted(m):
        if type(m) is nn.Conv1d:
            shape = m.kernel_size == (7,) and m.stride == (1,)
        elif type(m) is nn.ConvTranspose1d:
            shape = m.kernel_size == (2 * m.stride[0],) and m.output_padding == (0,) and m.dilation == (1,)
        else:
            return False
        return (shape and m.groups == 1 and m.padding == (0,) and m.weight.dtype == torch.float32
                and min(m.in_channels, m.out_channels) >= WINOGRAD_MIN_CHANNELS)

    return _swap(module, wanted, lambda m: (WinogradConv1d if type(m) is nn.Conv1d else WinogradConvTranspose1d)(m))


class NarrowConv1d(nn.Module):
    """`nn.Conv1d` with few outputs per position (Cout x kernel <= 16; float32, stride 1, no padding,
    groups 1), such as the codec's last conv (96 channels -> 1, kernel 7): one GEMM of the input's
    channels against every (output, tap) pair, (Cout * K, Cin) x (Cin, L), then each output the sum of
    its taps' rows shifted by the tap's offset. oneDNN's convolution runs this shape far below its rate:
    the 0.6B codec's, 8 streams x 1926 positions, 2.2 -> 0.4 ms. Another summation order than the
    direct convolution (float32 rounding, ~1e-7 relative), so not for parity runs (`narrow_convs`).
    Keeps the attributes callers read."""

    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        assert conv.stride == (1,) and conv.padding == (0,) and conv.groups == 1, conv
        assert conv.weight.dtype == torch.float32, conv.weight.dtype
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.dilation, self.stride = conv.kernel_size, conv.dilation, conv.stride
        # rows o * K + k: output o's tap k
        self.taps = nn.Parameter(conv.weight.detach().permute(0, 2, 1).reshape(-1, conv.in_channels).contiguous(),
                                 requires_grad=False)
        self.bias = conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, Cin, L) -> (B, Cout, L - (K - 1) * dilation)
        (K,), (d,) = self.kernel_size, self.dilation
        T = x.shape[-1] - (K - 1) * d
        if T <= 0:
            raise ValueError(f"NarrowConv1d: {x.shape[-1]} input positions, the kernel spans {(K - 1) * d + 1}")
        z = torch.matmul(self.taps, x).unflatten(1, (self.out_channels, K))  # (B, Cout, K, L)
        y = z[:, :, 0, :T].clone() if self.bias is None else z[:, :, 0, :T] + self.bias[:, None]
        for k in range(1, K):
            y += z[:, :, k, k * d: k * d + T]
        return y

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, dilation={self.dilation}"


NARROW_MIN_CHANNELS = 16  # input channels, below which a direct convolution is cheap anyway


def narrow_convs(module: nn.Module, parity: bool = False) -> int:
    """Replace, in place, every float32 `nn.Conv1d` under `module` of at least `NARROW_MIN_CHANNELS`
    input channels, fewer outputs than inputs and at most 16 (output, tap) pairs (stride 1, no padding,
    groups 1) by a `NarrowConv1d`; returns how many. Like `winograd_convs`, not for parity runs (another summation order), and `OMNITTS_WINOGRAD`
    overrides alike."""
    if not _rounding_allowed(parity):
        return 0

    def wanted(m):
        return (type(m) is nn.Conv1d and m.weight.dtype == torch.float32 and m.in_channels >= NARROW_MIN_CHANNELS
                and m.out_channels < m.in_channels and m.out_channels * m.kernel_size[0] <= 16
                and m.stride == (1,) and m.padding == (0,) and m.groups == 1)

    return _swap(module, wanted, NarrowConv1d)


class ChannelsLastResidualUnit(nn.Module):
    """A codec `ResidualUnit`, x + conv2(act2(conv1(act1(x)))), over channels-last activations (B, T, C):
    its `WinogradConv1d` (channels-last inside) without the two layout changes around it, SnakeBeta's
    float32 kernel on channels-last rows, and the 1x1 conv2 as a oneDNN inner product that adds the
    residual as it writes. The unit's three passes of a block then run between one layout change in and
    one out (`enter`, `leave`) instead of two each. Measured (AVX-512 EPYC, 2 threads, float32): the 1x1
    conv and the residual add over 96 channels x 15360 positions 8.7 -> 1.4 ms, 192 x 5120 2.8 -> 1.8,
    384 x 1280 2.2 -> 1.7, 768 x 800 7.2 -> 4.3. Within float rounding of the module (another summation
    order for conv2). Shares the unit's parameters."""

    def __init__(self, unit: nn.Module):
        super().__init__()
        conv1, conv2 = unit.conv1.conv, unit.conv2.conv
        assert isinstance(conv1, WinogradConv1d) and type(conv2) is nn.Conv1d and conv2.kernel_size == (1,), unit
        self.act1, self.act2, self.conv1 = unit.act1, unit.act2, conv1
        self.keep = unit.conv1.span - 1  # causal state: the last inputs conv1 sees again
        self.weight = nn.Parameter(
            torch.ops.mkldnn._reorder_linear_weight(conv2.weight.detach()[:, :, 0].contiguous(), layout_batch(32)),
            requires_grad=False)
        self.bias = conv2.bias

    @staticmethod
    def enter(x: torch.Tensor) -> torch.Tensor:  # (B, C, T) -> (B, T, C)
        return torch.ops.omnitts.transpose_pad(x)

    @staticmethod
    def leave(x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, C, T)
        return torch.ops.omnitts.transpose_pad(x)

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C) after `state` (B, span - 1, C) -> (the unit's output (B, T, C), the next state)."""
        (B, T, C), d = x.shape, self.conv1.dilation[0]
        full = torch.cat([state, torch.ops.omnitts.snake_channels_last(x, *self.act1.coefficients())], dim=1)
        h = self.conv1._correlate(full, d, -(-T // (self.conv1.m * d)), T)
        h = torch.ops.omnitts.snake_channels_last(h, *self.act2.coefficients())
        y = torch.ops.mkldnn._linear_pointwise.binary(h.view(B * T, C), x.reshape(B * T, C), self.weight, self.bias,
                                                      "add")
        return y.view(B, T, C), full[:, full.shape[1] - self.keep:].contiguous()

    def extra_repr(self) -> str:
        return f"{self.conv1.in_channels}, dilation={self.conv1.dilation}, channels-last"


def channels_last_units(module: nn.Module) -> int:
    """Give every codec `ResidualUnit` under `module` whose kernel-7 conv runs as a `WinogradConv1d` and
    whose SnakeBetas are float32 a `ChannelsLastResidualUnit` (its `channels_last`); returns how many.
    Call it after `winograd_convs` and before `pack_convs` (it takes conv2 as a plain 1x1 `nn.Conv1d`).
    The Winograd rule decides where: never for parity runs."""
    found = [m for m in module.modules() if isinstance(m, ResidualUnit) and isinstance(m.conv1.conv, WinogradConv1d)
             and type(m.conv2.conv) is nn.Conv1d and m.act1.alpha.dtype == torch.float32]
    for m in found:
        m.channels_last = ChannelsLastResidualUnit(m)
    return len(found)


# Transposed convs of up to this many weights run as `GemmConvTranspose1d` in float32 (where oneDNN
# packs). Measured in the 0.6B codec's streaming decode (AVX-512 EPYC, 2 threads, 25-frame calls in
# 8-frame tiles; time in each layer over the same 200 frames, three interleaved rounds): 384 -> 192
# (kernel 8, 0.6M weights) 650-720 ms as oneDNN's, 340-410 as a GEMM; 192 -> 96 (kernel 6) 360-400 ->
# 305-340; but 768 -> 384 (kernel 10, 2.9M) 220-235 -> 375-395 and 1536 -> 768 (kernel 16, 19M)
# 160-185 -> 350-410: few positions per call streaming a big weight suit oneDNN's packed kernel. The
# whole decode: 38-41 -> 36-37 ms per frame.
GEMM_TRANSPOSED_MAX_WEIGHTS = 1 << 20


def pack_transposed_convs(module: nn.Module) -> int:
    """Replace every `nn.ConvTranspose1d` under `module` whose dtype oneDNN packs (`onednn_packs`) by a
    `PackedConvTranspose1d`, or a `GemmConvTranspose1d` for small float32 ones (see
    `GEMM_TRANSPOSED_MAX_WEIGHTS`), in place; returns how many (0 where packing is off or unavailable)."""
    def wanted(m):
        return type(m) is nn.ConvTranspose1d and onednn_packs(m.weight.dtype)

    def make(m):  # (each class asserts the padding, groups and dilation it takes)
        small = m.weight.numel() <= GEMM_TRANSPOSED_MAX_WEIGHTS and m.weight.dtype == torch.float32
        return GemmConvTranspose1d(m) if small and m.kernel_size[0] % m.stride[0] == 0 else PackedConvTranspose1d(m)

    return _swap(module, wanted, make)
