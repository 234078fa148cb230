"""CPU weight preparation for the codec: its convolutions laid out, or rewritten, once at load time.

Like the LMs' linear layers (cpu_weights.py), the codec's transposed convolutions keep a weight laid
out once (`pack_transposed_convs`): torch's `conv_transpose1d` reorders its weight into oneDNN's
layout on every call (75 MB for the 0.6B codec's first upsampling block), which at streaming chunk
sizes costs more than the arithmetic. There the kernel is the one torch calls anyway, so results are
unchanged (bitwise, measured), in float32 and, for a codec loaded in bfloat16, in bfloat16. Except
the late, small ones in float32: with many positions per call and a small weight, oneDNN's
transposed convolution runs far below the GEMM's rate, so those become one GEMM and an overlap-add
(`GemmConvTranspose1d`). The biggest plain convolution (the decoder's first, 44 MB over 4 positions
per frame) keeps a reordered weight too (`PackedConv1d`, `pack_convs`): torch's `conv1d` reorders it
on every call. In bfloat16 runs the float32 codec's convolutions take fewer multiplications instead
(`winograd_convs`, before the packing, which takes what is left): Winograd's F(6, 7) for the
kernel-7 ones (`WinogradConv1d`), F(3, 2) over the polyphase form of the transposed ones
(`WinogradConvTranspose1d`), transforms omnitts' kernels.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..models.codec import ResidualUnit
from . import native
from .cpu_weights import layout_batch, onednn_packs, swap_modules


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

    return swap_modules(module, wanted, PackedConv1d)


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

    return swap_modules(module, wanted, lambda m: (WinogradConv1d if type(m) is nn.Conv1d else WinogradConvTranspose1d)(m))


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

    return swap_modules(module, wanted, NarrowConv1d)


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

    return swap_modules(module, wanted, make)
