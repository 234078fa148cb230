"""CPU weight preparation: packed linears compute what nn.Linear does; loading maps, packs and widens."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import omnitts
from omnitts.device import native
from omnitts.device.cpu_weights import PackedLinear, can_pack, pack_linears

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

needs_pack = pytest.mark.skipif(not can_pack(torch.float32), reason="oneDNN not available in this torch build")
needs_native = pytest.mark.skipif(not native.available(torch.float32), reason="the native kernels do not build here")


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
@pytest.mark.parametrize("use_native", [True, False])
def test_pack_linears_widens_one_at_a_time(use_native, monkeypatch):
    """oneDNN gets float32 weights; the native kernel keeps bfloat16-stored ones and widens as it reads."""
    if use_native and not native.available(torch.float32):
        pytest.skip("native kernel not built here")
    monkeypatch.setattr(native, "available", native.available if use_native else (lambda dtype: False))
    model = nn.Sequential(nn.Linear(8, 8).to(torch.bfloat16), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)))
    x = torch.randn(3, 8)
    wide = nn.Linear(8, 8)
    wide.load_state_dict({k: v.float() for k, v in model[0].state_dict().items()})
    assert pack_linears(model, torch.float32) == 2
    assert isinstance(model[0], PackedLinear) and isinstance(model[2][0], PackedLinear)
    assert model[0].native == use_native and (model[0].out_features, model[0].in_features) == (8, 8)
    assert model[0].weight.dtype == (torch.bfloat16 if use_native else torch.float32)
    assert model[2][0].weight.dtype == torch.float32  # stored float32: packed as is
    torch.testing.assert_close(model[0](x), wide(x), rtol=1e-5, atol=1e-5)



@needs_native
def test_packed_linears_in_a_huge_page_arena_compute_the_same():
    """Weights packed into the arena (as the loader does) give bitwise what torch-allocated ones give."""
    from omnitts.device.hugepages import HugePageArena

    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(64, 48).to(torch.bfloat16), nn.Linear(48, 33))
    twin = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 33))
    twin.load_state_dict(model.state_dict())
    twin[0].to(torch.bfloat16)
    arena = HugePageArena()
    assert pack_linears(model, torch.float32, arena=arena) == 2 and pack_linears(twin, torch.float32) == 2
    x = torch.randn(5, 64)
    assert torch.equal(model(x), twin(x))
    if arena.on:
        assert model[0].weight.data_ptr() % (2 << 20) == 0  # the arena's first chunk starts on a huge page

@needs_pack
def test_widening_reuses_one_buffer_and_packs_stay_independent(monkeypatch):
    """Weights widened in one shared buffer (for oneDNN): each packed linear keeps its own weight."""
    from omnitts.device.cpu_weights import Widener

    monkeypatch.setattr(native, "available", lambda dtype: False)
    torch.manual_seed(0)
    widen = Widener()
    linears = [nn.Linear(32, 48), nn.Linear(64, 16)]
    for m in linears:  # as the loader leaves them: weight in its stored bfloat16, bias float32
        m.weight.data = m.weight.data.bfloat16()
    packed = [PackedLinear(m, torch.float32, widen=widen) for m in linears]
    assert list(widen.buffers) == [torch.float32] and widen.buffers[torch.float32].numel() == 48 * 32  # the larger one
    for linear, pack in zip(linears, packed):  # the second widening overwrote the first's temporary
        wide = nn.Linear(linear.in_features, linear.out_features).to(torch.float32)
        wide.load_state_dict({k: v.float() for k, v in linear.state_dict().items()})
        assert pack.weight.dtype == torch.float32
        x = torch.randn(3, linear.in_features)
        torch.testing.assert_close(pack(x), wide(x), rtol=1e-5, atol=1e-5)
    same = torch.randn(4, 4)
    assert widen(same, torch.float32) is same  # nothing to widen: the weight itself


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float32_attention_is_sdpa_widened(dtype):
    """float32 inputs: exactly torch's sdpa; bfloat16: sdpa over the widened inputs, cast back."""
    from omnitts.models.layers import float32_attention, sdpa_attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 5, 16, generator=g).to(dtype)
    k, v = (torch.randn(3, 2, 9, 16, generator=g).to(dtype) for _ in range(2))  # grouped: 2 K/V heads
    mask = torch.rand(3, 1, 5, 9, generator=g) > 0.3
    mask[..., 0] = True
    for m, causal in ((mask, False), (None, True), (None, False)):
        kk, vv = (k, v) if not causal else (k[:, :, :5], v[:, :, :5])
        out = float32_attention(q, kk, vv, m, causal)
        assert out.dtype == dtype
        wide = sdpa_attention(q.float(), kk.float(), vv.float(), m, causal).to(dtype)
        assert torch.equal(out, wide)
        torch.testing.assert_close(out.float(), sdpa_attention(q, kk, vv, m, causal).float(), rtol=2e-2, atol=2e-2)


def test_bfloat16_cpu_model_attends_in_float32_over_its_own_kv(tts_factory):
    """On the CPU a bfloat16 talker and predictor attend in float32: omnitts' decode kernel where it
    builds, reading the K/V history in bfloat16 (widened as read, so the codes are those of a float32
    history, which torch's fallback keeps); the batched engine equals the one-request slow path.
    float32 models get the same kernel, their cache stays float32; float16 ones keep a float32 one."""
    from omnitts.device.cpu_weights import cpu_attention, native_attention
    from omnitts.engine import Engine, EngineConfig
    from omnitts.engine.reference import generate_codes
    from omnitts.models.layers import DecoderStack
    from omnitts.request import Request

    built = native.available(torch.float32)
    # Without the native kernels: torch's float32 attention, with one-query calls in fixed key chunks.
    kernel, history = (native_attention, torch.bfloat16) if built else (cpu_attention, torch.float32)
    tts = tts_factory("custom_voice", dtype="bfloat16")
    stacks = [m for m in tts.ckpt.model.talker.modules() if isinstance(m, DecoderStack)]
    assert len(stacks) == 2 and all(s.attend is kernel for s in stacks)
    assert tts.ckpt.cache_dtype == history and tts.ckpt.dtype == torch.bfloat16
    jobs = [(Request("Wide attention.", speaker="ryan"), tts.default_params(True, max_frames=8)),
            (Request("A second, longer request here.", speaker="vivian"), tts.default_params(True, max_frames=10))]

    def run_engine():
        engine = Engine(tts.ckpt, EngineConfig(max_num_seqs=2, max_positions=256))
        assert all(t.dtype == tts.ckpt.cache_dtype for t in engine.cache.tensors())
        frame = engine.runner.predictor_cache  # the predictor's frame K/V
        assert all(t.dtype == tts.ckpt.cache_dtype for t in frame.k + frame.v)
        seqs = [engine.add(tts.prompts.build(req, None), params, tag=i) for i, (req, params) in enumerate(jobs)]
        done = {seq.tag: seq.codes() for seq in engine.run()}
        assert len(done) == len(seqs)
        return done

    done = run_engine()
    for i, (req, params) in enumerate(jobs):
        slow = generate_codes(tts.ckpt, tts.prompts.build(req, None), params).codes.numpy()
        assert (done[i] == slow).all(), f"request {i}"
    narrow = [stack.kv_dtype for stack in stacks]
    try:  # a float32 history, widened on write: the same codes (the model is the session's: put it back)
        for stack in stacks:
            stack.kv_dtype = torch.float32
        wide = run_engine()
    finally:
        for stack, kv_dtype in zip(stacks, narrow):
            stack.kv_dtype = kv_dtype
    assert all((wide[i] == done[i]).all() for i in done)

    f32 = tts_factory("custom_voice")
    f32_stacks = [m for m in f32.ckpt.model.talker.modules() if isinstance(m, DecoderStack)]
    assert all(m.attend is kernel for m in f32_stacks)
    assert f32.ckpt.cache_dtype == torch.float32
    half = tts_factory("custom_voice", dtype="float16")  # a history the kernel does not read: float32
    assert half.ckpt.cache_dtype == torch.float32


@needs_native
def test_native_decode_attention_matches_sdpa_and_is_batch_invariant():
    """One query per row over a prefix view of a preallocated cache, grouped heads, per-row masks: the
    native kernel gives sdpa's result within float rounding, each row bitwise the same alone as in a
    batch, on two threads as on one; other calls (several queries, other masks) fall back to sdpa's."""
    torch.manual_seed(0)
    torch.set_num_threads(2)  # rows split across threads (conftest puts one thread back)
    for heads, kv_heads, dim in ((4, 2, 32), (16, 8, 128), (4, 4, 64), (8, 2, 32), (6, 2, 24)):
        _check_decode_attention(heads, kv_heads, dim)


def _check_decode_attention(heads, kv_heads, dim):
    """The kernel's vectorised shapes (head_dim 32/64/128, groups of 1/2/4) and the generic loop (others)."""
    from omnitts.device.cpu_weights import native_attention
    from omnitts.models.layers import sdpa_attention

    batch, capacity = 5, 40
    cache_k, cache_v = torch.randn(2, batch, kv_heads, capacity, dim)
    for keys in (1, 7, 33):
        k, v = cache_k[:, :, :keys], cache_v[:, :, :keys]
        q = torch.randn(batch, heads, 1, dim)
        lengths = torch.tensor([keys, 1, max(1, keys // 2), keys, max(1, keys - 3)])
        mask = (torch.arange(keys)[None] < lengths[:, None])[:, None, None, :]
        for m in (mask, None, mask[:1]):
            want = sdpa_attention(q, k, v, m, False)
            got = native_attention(q, k, v, m, False)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        got = native_attention(q, k, v, mask, False)
        for row in range(batch):
            alone = native_attention(q[row:row + 1], k[row:row + 1], v[row:row + 1], mask[row:row + 1], False)
            assert torch.equal(alone, got[row:row + 1]), (keys, row)
    # bfloat16 K/V: the float32 result of the widened history, bitwise.
    narrow_k, narrow_v = k.bfloat16(), v.bfloat16()
    assert torch.equal(native_attention(q, narrow_k, narrow_v, mask, False),
                       native_attention(q, narrow_k.float(), narrow_v.float(), mask, False))
    half = native_attention(q.bfloat16(), k, v, mask, False)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), native_attention(q.bfloat16().float(), k, v, mask, False), rtol=0, atol=1e-2)
    several = torch.randn(batch, heads, 3, dim)
    causal = native_attention(several, k[:, :, :3], v[:, :, :3], None, True)
    assert torch.equal(causal, sdpa_attention(several, k[:, :, :3], v[:, :, :3], None, True))


@needs_pack
@pytest.mark.parametrize("dtype,bias,width,outputs", [
    (torch.bfloat16, False, 48, 2048), (torch.bfloat16, True, 72, 96), (torch.bfloat16, False, 32, 3072),
    (torch.float32, True, 1024, 2048), (torch.float32, False, 96, 160)])
def test_a_row_of_a_onednn_linear_is_the_same_alone_and_among_others(dtype, bias, width, outputs, monkeypatch):
    """oneDNN's one-row kernel summed in another order than its kernel of two rows or more on a Xeon with
    AMX (bfloat16 widths 32-72; float32 with a bias): 2 to 12 rows of 100 differed, every row for the
    float32 case, and the invariance test failed there. Up to 32 rows (the packed layout's batch) a row's
    bits must not depend on its neighbours."""
    if not can_pack(dtype):
        pytest.skip(f"{dtype} packing unsupported here")
    monkeypatch.setattr(native, "available", lambda dtype: False)
    torch.manual_seed(0)
    packed = PackedLinear(nn.Linear(width, outputs, bias=bias), dtype, batch=32)
    rows = torch.randn(100, width).to(dtype)
    for r in range(100):
        alone = packed(rows[r:r + 1])
        assert torch.equal(packed(rows[r]), alone[0])  # a 1-D row: one row too
        for others in (1, 5, 31):
            assert torch.equal(packed(torch.cat([rows[r:r + 1], rows[:others]]))[:1], alone), (r, others)
