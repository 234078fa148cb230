"""CPU weight preparation for the codec: packed, GEMM, Winograd and narrow convolutions compute what torch's do;
loading swaps them in where they pay and keeps parity runs on the direct ones."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import omnitts
from omnitts.device import native
from omnitts.device.cpu_weights import can_pack

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

needs_pack = pytest.mark.skipif(not can_pack(torch.float32), reason="oneDNN not available in this torch build")


@needs_pack
def test_packed_transposed_conv_matches_conv_transpose():
    from omnitts.device.cpu_convs import PackedConvTranspose1d

    torch.manual_seed(0)
    conv = nn.ConvTranspose1d(48, 24, 10, stride=5)
    packed = PackedConvTranspose1d(conv)
    assert (packed.in_channels, packed.out_channels, packed.stride) == (48, 24, (5,))
    for shape in [(1, 48, 1), (3, 48, 7), (2, 48, 40)]:
        x = torch.randn(shape)
        got, want = packed(x), conv(x)
        assert got.shape == want.shape and got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gemm_transposed_conv_matches_conv_transpose():
    """One GEMM and an overlap-add give the transposed convolution, for kernels of 1-3 strides."""
    from omnitts.device.cpu_convs import GemmConvTranspose1d

    torch.manual_seed(0)
    for cin, cout, kernel, stride, bias in [(48, 24, 10, 5, True), (16, 8, 2, 2, True), (8, 4, 6, 3, False),
                                            (12, 6, 9, 3, True)]:
        conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride, bias=bias)
        gemm = GemmConvTranspose1d(conv)
        assert (gemm.in_channels, gemm.out_channels, gemm.stride, gemm.kernel_size) == (cin, cout, (stride,), (kernel,))
        for shape in [(1, cin, 1), (3, cin, 7), (2, cin, 40)]:
            x = torch.randn(shape)
            got, want = gemm(x), conv(x)
            assert got.shape == want.shape and got.is_contiguous()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_pack
def test_small_float32_transposed_convs_run_as_gemm():
    """Small float32 transposed convs become GEMMs, big ones and bfloat16 ones oneDNN's packed kernel."""
    from omnitts.device import cpu_convs
    from omnitts.device.cpu_convs import GemmConvTranspose1d, PackedConvTranspose1d, pack_transposed_convs

    limit = cpu_convs.GEMM_TRANSPOSED_MAX_WEIGHTS
    small = nn.ConvTranspose1d(8, 8, 4, stride=2)
    big = nn.ConvTranspose1d(limit // 64 + 1, 16, 4, stride=2)
    odd = nn.ConvTranspose1d(8, 8, 5, stride=2)  # kernel not a multiple of the stride
    model = nn.Sequential(small, big, odd)
    assert pack_transposed_convs(model) == 3
    assert [type(m) for m in model] == [GemmConvTranspose1d, PackedConvTranspose1d, PackedConvTranspose1d]
    if can_pack(torch.bfloat16):
        half = nn.Sequential(nn.ConvTranspose1d(8, 8, 4, stride=2).to(torch.bfloat16))
        pack_transposed_convs(half)
        assert type(half[0]) is PackedConvTranspose1d


@needs_pack
@pytest.mark.skipif(not can_pack(torch.bfloat16), reason="no native bfloat16 on this CPU")
def test_packed_transposed_conv_in_bfloat16_is_torchs_own_kernel():
    """A bfloat16 codec's transposed convs pack too, in bfloat16: the kernel torch calls, so bitwise."""
    from omnitts.device.cpu_convs import PackedConvTranspose1d

    torch.manual_seed(0)
    conv = nn.ConvTranspose1d(48, 24, 8, stride=4).to(torch.bfloat16)
    packed = PackedConvTranspose1d(conv)
    assert packed.weight.dtype == torch.bfloat16
    x = torch.randn(2, 48, 30).to(torch.bfloat16)
    assert torch.equal(packed(x), conv(x))


@needs_pack
def test_loaded_codec_has_packed_transposed_convs(ckpt_dir, monkeypatch):
    from omnitts.device.cpu_convs import GemmConvTranspose1d, PackedConvTranspose1d

    folder = ckpt_dir("custom_voice")
    packed = omnitts.load(folder, dtype="float32").ckpt.codec
    kinds = (PackedConvTranspose1d, GemmConvTranspose1d)
    assert any(isinstance(m, kinds) for m in packed.modules())
    assert not any(type(m) is nn.ConvTranspose1d for m in packed.modules())
    monkeypatch.setenv("OMNITTS_PACK", "0")
    plain = omnitts.load(folder, dtype="float32").ckpt.codec
    assert not any(isinstance(m, kinds) for m in plain.modules())
    codes = torch.randint(0, 2048, (1, 16, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(packed(codes), plain(codes), rtol=0, atol=1e-5)


@needs_pack
def test_packed_conv_matches_conv():
    """A conv whose weight oneDNN reordered once gives torch's conv1d, dilated or not, any batch."""
    from omnitts.device.cpu_convs import PackedConv1d

    torch.manual_seed(0)
    for cin, cout, kernel, dilation, bias in [(48, 24, 7, 1, True), (16, 32, 7, 3, False), (8, 8, 3, 9, True)]:
        conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, bias=bias)
        packed = PackedConv1d(conv)
        assert (packed.in_channels, packed.out_channels, packed.kernel_size, packed.dilation) == (
            cin, cout, (kernel,), (dilation,))
        span = (kernel - 1) * dilation + 1
        for batch, length in [(1, span), (3, span + 6), (2, span + 100)]:
            x = torch.randn(batch, cin, length)
            got, want = packed(x), conv(x)
            assert got.shape == want.shape and got.is_contiguous()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if can_pack(torch.bfloat16):
        conv = nn.Conv1d(48, 24, 7, dilation=3).to(torch.bfloat16)
        x = torch.randn(2, 48, 60).to(torch.bfloat16)
        got = PackedConv1d(conv)(x)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), conv(x).float(), rtol=2e-2, atol=2e-2)


@needs_pack
def test_only_big_plain_convs_are_packed(monkeypatch):
    """`pack_convs` takes convs of at least PACKED_CONV_MIN_WEIGHTS weights, groups 1, stride 1, no
    padding; the rest keep torch's conv1d."""
    from omnitts.device import cpu_convs
    from omnitts.device.cpu_convs import PackedConv1d, pack_convs

    monkeypatch.setattr(cpu_convs, "PACKED_CONV_MIN_WEIGHTS", 8 * 8 * 7)
    model = nn.Sequential(nn.Conv1d(8, 8, 7), nn.Conv1d(8, 8, 3), nn.Conv1d(16, 16, 7, groups=2),
                          nn.Conv1d(8, 8, 7, stride=2), nn.Conv1d(8, 8, 7, padding=3), nn.Conv1d(16, 8, 7, dilation=9))
    assert pack_convs(model) == 2
    assert [type(m) is PackedConv1d for m in model] == [True, False, False, False, False, True]


@needs_pack
def test_loaded_codec_with_packed_convs_decodes_the_same(ckpt_dir, monkeypatch):
    """The tiny codec with every plain conv packed (the limit lowered to 0) decodes, whole and
    streamed, what the unpacked codec decodes, within float rounding."""
    from omnitts.device import cpu_convs
    from omnitts.device.cpu_convs import PackedConv1d

    monkeypatch.setattr(cpu_convs, "PACKED_CONV_MIN_WEIGHTS", 0)
    packed, plain = _codecs_with_and_without(ckpt_dir("custom_voice"), PackedConv1d, "OMNITTS_PACK", "float32",
                                             monkeypatch)
    codes = torch.randint(0, 2048, (2, 16, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = plain(codes)
        torch.testing.assert_close(packed(codes), want, rtol=0, atol=1e-5)
        torch.testing.assert_close(_streamed_in_two_calls(packed, codes), want, rtol=0, atol=1e-5)


def _codecs_with_and_without(folder, kind, switch, dtype, monkeypatch):
    """The checkpoint's codec loaded in `dtype` with `kind` layers (at least 10 of them), and again with
    environment switch `switch` at 0 (none)."""
    on = omnitts.load(folder, dtype=dtype).ckpt.codec
    assert sum(isinstance(m, kind) for m in on.modules()) >= 10
    monkeypatch.setenv(switch, "0")
    off = omnitts.load(folder, dtype=dtype).ckpt.codec
    assert not any(isinstance(m, kind) for m in off.modules())
    return on, off


def _streamed_in_two_calls(codec, codes):
    """`codes` (2 rows of 9 frames) decoded by a StreamingCodec in two calls (4 frames, then 5)."""
    from omnitts.models.codec_stream import StreamingCodec

    stream = StreamingCodec(codec, 64)
    state, pieces = stream.new_state(2), []
    for start, n in ((0, 4), (4, 5)):
        wav, state = stream.step(codes[..., start:start + n], state, [start] * 2, [0] * 2, [start + n] * 2)
        pieces.append(wav)
    return torch.cat(pieces, -1)


needs_winograd = pytest.mark.skipif(
    not native.available(torch.float32) or not torch.ops.omnitts.vectorised_float32(),
    reason="the native kernels do not build here with AVX-512")


@needs_winograd
def test_winograd_takes_wide_float32_kernel7_convs_only(monkeypatch):
    """`winograd_convs` takes float32 kernel-7 convs of groups 1, stride 1, no padding and transposed
    convs of kernel 2 * stride, groups 1, no padding, with at least WINOGRAD_MIN_CHANNELS in and out,
    not for parity runs unless `OMNITTS_WINOGRAD=1`;
    `OMNITTS_WINOGRAD=0` leaves every conv alone."""
    from omnitts.device import cpu_convs
    from omnitts.device.cpu_convs import winograd_convs

    def model():
        return nn.Sequential(nn.Conv1d(16, 16, 7, dilation=3), nn.Conv1d(16, 16, 3), nn.Conv1d(16, 16, 7, groups=2),
                             nn.Conv1d(16, 16, 7, stride=2), nn.Conv1d(16, 16, 7, padding=3), nn.Conv1d(8, 16, 7),
                             nn.Conv1d(16, 8, 7), nn.Conv1d(16, 16, 7).to(torch.bfloat16), nn.Conv1d(24, 16, 7, dilation=9),
                             nn.ConvTranspose1d(16, 16, 8, stride=4), nn.ConvTranspose1d(16, 16, 6, stride=2),
                             nn.ConvTranspose1d(16, 16, 4, stride=2, padding=1), nn.ConvTranspose1d(16, 8, 4, stride=2),
                             nn.ConvTranspose1d(16, 16, 4, stride=2).to(torch.bfloat16))

    monkeypatch.setattr(cpu_convs, "WINOGRAD_MIN_CHANNELS", 16)
    swapped = model()
    assert winograd_convs(swapped) == 3
    assert [type(m).__name__ for m in swapped] == (
        ["WinogradConv1d"] + ["Conv1d"] * 7 + ["WinogradConv1d", "WinogradConvTranspose1d"] + ["ConvTranspose1d"] * 4)
    assert swapped[0].dilation == (3,) and swapped[8].in_channels == 24 and swapped[9].stride == (4,)
    assert winograd_convs(model(), parity=True) == 0  # a float32 run's codec keeps the direct convs
    monkeypatch.setenv("OMNITTS_WINOGRAD", "1")
    assert winograd_convs(model(), parity=True) == 3
    monkeypatch.setenv("OMNITTS_WINOGRAD", "0")
    assert winograd_convs(model()) == 0


def test_narrow_conv_is_the_convolution_within_rounding():
    """`NarrowConv1d` (one GEMM over every (output, tap) pair, then shifted sums) computes the module's
    convolution within float32 rounding: kernels 1 to 7, dilations, several outputs, no bias; a
    contiguous (B, Cout, T) answer, and the error of a kernel longer than its input."""
    from omnitts.device.cpu_convs import NarrowConv1d

    torch.manual_seed(3)
    for cin, cout, k, d, bias in [(96, 1, 7, 1, True), (32, 2, 7, 3, False), (16, 4, 3, 2, True), (40, 1, 1, 1, True)]:
        conv = nn.Conv1d(cin, cout, k, dilation=d, bias=bias)
        x = torch.randn(3, cin, 50)
        with torch.no_grad():
            want, got = conv(x), NarrowConv1d(conv)(x)
        assert got.shape == want.shape and got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6 * want.abs().max().item())
    with pytest.raises(ValueError, match="input positions"):
        NarrowConv1d(nn.Conv1d(16, 1, 7, dilation=2))(torch.randn(1, 16, 12))


def test_narrow_convs_take_float32_convs_of_few_outputs_outside_parity(monkeypatch):
    """`narrow_convs` takes float32 convs of stride 1, no padding, groups 1, at least NARROW_MIN_CHANNELS
    in, fewer out than in and at most 16 (output, tap) pairs; not in parity runs unless `OMNITTS_WINOGRAD=1`, never with
    `OMNITTS_WINOGRAD=0`."""
    from omnitts.device.cpu_convs import narrow_convs

    def model():
        return nn.Sequential(nn.Conv1d(96, 1, 7), nn.Conv1d(32, 2, 7, dilation=3), nn.Conv1d(32, 3, 7),
                             nn.Conv1d(8, 1, 7), nn.Conv1d(32, 1, 7, stride=2), nn.Conv1d(32, 1, 7, padding=3),
                             nn.Conv1d(32, 2, 7, groups=2), nn.Conv1d(32, 1, 7).to(torch.bfloat16),
                             nn.Conv1d(16, 16, 1))

    swapped = model()
    assert narrow_convs(swapped) == 2
    assert [type(m).__name__ for m in swapped] == ["NarrowConv1d"] * 2 + ["Conv1d"] * 7
    assert swapped[1].dilation == (3,) and swapped[1].out_channels == 2
    assert narrow_convs(model(), parity=True) == 0
    monkeypatch.setenv("OMNITTS_WINOGRAD", "1")
    assert narrow_convs(model(), parity=True) == 2
    monkeypatch.setenv("OMNITTS_WINOGRAD", "0")
    assert narrow_convs(model()) == 0



@needs_winograd
def test_transposed_winograd_weights_in_float32_are_float64s_rounded():
    """F(3, 2)'s weight transform (points 0, +-1) is done in float32: each product weight is one tap or
    half a sum or difference of two, rounded once, so it equals the float64 transform rounded (bitwise)."""
    from omnitts.device.cpu_convs import TRANSPOSED_WINOGRAD_POINTS, WinogradConvTranspose1d

    torch.manual_seed(5)
    conv = nn.ConvTranspose1d(24, 16, kernel_size=8, stride=4)
    fast = WinogradConvTranspose1d(conv)
    exact = WinogradConvTranspose1d(conv)
    w = conv.weight.detach().view(24, 16, 2, 4).flip(2).permute(3, 1, 0, 2).reshape(64, 24, 2)
    exact._set_transforms(3, TRANSPOSED_WINOGRAD_POINTS[:3], w, exact.bias, exact=torch.float64)
    dense = [[t.to_dense() if t.is_mkldnn else t for t in m.weights] for m in (fast, exact)]
    assert len(dense[0]) == 4 and all(torch.equal(a, b) for a, b in zip(*dense))
    x = torch.randn(2, 24, 9)
    torch.testing.assert_close(fast(x), conv(x), rtol=1e-5, atol=1e-5)
    assert all(t.abs().sum() > 0 for t in dense[0])

@needs_winograd
def test_loaded_codec_with_winograd_convs_decodes_the_same(ckpt_dir, monkeypatch):
    """A bfloat16 model's float32 codec with every kernel-7 conv and every kernel-2s transposed conv on
    Winograd (the channel limits lowered), its residual units channels-last and its last conv a
    `NarrowConv1d`, decodes, whole and streamed,
    what the direct convolutions decode within 1e-4 (measured 3.9e-5 on the 0.6B codec's waveform peak of 0.16, its SnakeBeta fused
    too); a float32 model (the parity runs) keeps them direct."""
    from omnitts.device import cpu_convs
    from omnitts.device.cpu_convs import (
        ChannelsLastResidualUnit,
        NarrowConv1d,
        WinogradConv1d,
        WinogradConvTranspose1d,
    )
    from omnitts.models.codec import ResidualUnit

    folder = ckpt_dir("custom_voice")
    monkeypatch.setattr(cpu_convs, "WINOGRAD_MIN_CHANNELS", 2)  # all but the last conv's one output
    monkeypatch.setattr(cpu_convs, "NARROW_MIN_CHANNELS", 1)
    kinds = (WinogradConv1d, WinogradConvTranspose1d)
    assert not any(isinstance(m, kinds) for m in omnitts.load(folder, dtype="float32").ckpt.codec.modules())
    wino, plain = _codecs_with_and_without(folder, WinogradConv1d, "OMNITTS_WINOGRAD", "bfloat16", monkeypatch)
    assert sum(isinstance(m, WinogradConvTranspose1d) for m in wino.modules()) == 4
    assert not any(isinstance(m, WinogradConvTranspose1d) for m in plain.modules())
    assert isinstance(wino.decoder[-1].conv, NarrowConv1d) and type(plain.decoder[-1].conv) is nn.Conv1d
    # every residual unit channels-last (the streamed decode's path; whole units take it too)
    units = [m for m in wino.modules() if isinstance(m, ResidualUnit)]
    assert units and all(isinstance(m.channels_last, ChannelsLastResidualUnit) for m in units)
    assert not any(m.channels_last is not None for m in plain.modules() if isinstance(m, ResidualUnit))
    assert next(wino.parameters()).dtype == torch.float32
    codes = torch.randint(0, 2048, (2, 16, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = plain(codes)
        whole = wino(codes)
        assert not torch.equal(whole, want)  # another algorithm: not bitwise
        torch.testing.assert_close(whole, want, rtol=0, atol=1e-4)
        torch.testing.assert_close(_streamed_in_two_calls(wino, codes), want, rtol=0, atol=1e-4)
