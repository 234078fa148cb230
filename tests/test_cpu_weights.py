"""CPU weight preparation: packed linears compute what nn.Linear does; loading maps, packs and widens."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import omnitts
from omnitts.device.cpu_weights import PackedLinear, can_pack, pack_linears

needs_pack = pytest.mark.skipif(not can_pack(torch.float32), reason="oneDNN not available in this torch build")


@needs_pack
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_matches_linear(dtype, batch):
    if not can_pack(dtype):
        pytest.skip(f"{dtype} packing unsupported here")
    torch.manual_seed(0)
    linear = nn.Linear(96, 160, bias=True).to(dtype)
    packed = PackedLinear(linear, batch=batch)  # laid out for batch-1 calls, or for batches
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for shape in [(1, 96), (7, 96), (2, 3, 96), (40, 96)]:
        x = torch.randn(shape).to(dtype)
        assert packed(x).shape == linear(x).shape and packed(x).dtype == dtype
        torch.testing.assert_close(packed(x).float(), linear(x).float(), rtol=tol, atol=tol)
    view = torch.randn(4, 2, 96).to(dtype)[:, -1]  # non-contiguous input, as `hidden[:, -1]`
    torch.testing.assert_close(packed(view).float(), linear(view).float(), rtol=tol, atol=tol)


@needs_pack
def test_pack_linears_widens_one_at_a_time():
    model = nn.Sequential(nn.Linear(8, 8).to(torch.bfloat16), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)))
    assert pack_linears(model, torch.float32) == 2
    assert isinstance(model[0], PackedLinear) and isinstance(model[2][0], PackedLinear)
    assert model[0].weight.dtype == torch.float32 and tuple(model[0].weight.shape) == (8, 8)


@needs_pack
def test_loaded_cpu_model_is_packed_and_equals_unpacked(ckpt_dir, monkeypatch):
    """Greedy codes of the packed model equal those of plain nn.Linear layers (OMNITTS_PACK=0)."""
    folder = ckpt_dir("custom_voice")
    packed = omnitts.load(folder, dtype="float32")
    layers = list(packed.ckpt.model.talker.modules())
    assert any(isinstance(m, PackedLinear) for m in layers) and not any(type(m) is nn.Linear for m in layers)
    monkeypatch.setenv("OMNITTS_PACK", "0")
    plain = omnitts.load(folder, dtype="float32")
    assert not any(isinstance(m, PackedLinear) for m in plain.ckpt.model.talker.modules())
    for text in ("Packed weights.", "A second, longer sentence to compare."):
        a = packed.synthesize(text, speaker="ryan", greedy=True, max_frames=12)
        b = plain.synthesize(text, speaker="ryan", greedy=True, max_frames=12)
        assert (a.codes == b.codes).all()


def test_text_embedding_stays_in_its_stored_dtype(ckpt_dir, tmp_path):
    """A bf16-stored checkpoint loaded as float32 keeps the 151936-row text table in bf16 (exact widening)."""
    from omnitts.testing.checkpoint import build_checkpoint

    folder = build_checkpoint(tmp_path / "bf16", kind="custom_voice", preset="tiny-0.6b", dtype="bfloat16")
    tts = omnitts.load(folder, dtype="float32")
    talker = tts.ckpt.model.talker
    assert talker.model.text_embedding.weight.dtype == torch.bfloat16
    ids = torch.tensor([[5, 77, 151000]])
    widened = talker.model.text_embedding.weight[ids].float()
    expected = talker.text_projection(widened)
    assert torch.equal(talker.embed_text(ids), expected) and talker.embed_text(ids).dtype == torch.float32


@needs_pack
def test_packed_transposed_conv_matches_conv_transpose():
    from omnitts.device.cpu_weights import PackedConvTranspose1d, pack_transposed_convs

    torch.manual_seed(0)
    conv = nn.ConvTranspose1d(48, 24, 10, stride=5)
    packed = PackedConvTranspose1d(conv)
    assert (packed.in_channels, packed.out_channels, packed.stride) == (48, 24, (5,))
    for shape in [(1, 48, 1), (3, 48, 7), (2, 48, 40)]:
        x = torch.randn(shape)
        got, want = packed(x), conv(x)
        assert got.shape == want.shape and got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    model = nn.Sequential(nn.ConvTranspose1d(8, 8, 4, stride=2), nn.Conv1d(8, 8, 3))
    assert pack_transposed_convs(model) == 1 and isinstance(model[0], PackedConvTranspose1d)


@needs_pack
def test_loaded_codec_has_packed_transposed_convs(ckpt_dir, monkeypatch):
    from omnitts.device.cpu_weights import PackedConvTranspose1d

    folder = ckpt_dir("custom_voice")
    packed = omnitts.load(folder, dtype="float32").ckpt.codec
    assert any(isinstance(m, PackedConvTranspose1d) for m in packed.modules())
    assert not any(type(m) is nn.ConvTranspose1d for m in packed.modules())
    monkeypatch.setenv("OMNITTS_PACK", "0")
    plain = omnitts.load(folder, dtype="float32").ckpt.codec
    assert not any(isinstance(m, PackedConvTranspose1d) for m in plain.modules())
    codes = torch.randint(0, 2048, (1, 16, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(packed(codes), plain(codes), rtol=0, atol=1e-5)
