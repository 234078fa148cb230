"""Shared transformer blocks: the fewer-kernel forms compute the reference's arithmetic.

RoPE with a signed sin table and a roll, RMSNorm with in-place steps, and fused q/k/v and gate/up
projections (one q/k norm over both head sets) against the reference's formulas and the modules
as built from the checkpoint (unfused).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from omnitts.device.cpu_weights import PackedLinear, Widener, can_pack
from omnitts.models.kv_cache import KVCache
from omnitts.models.layers import (
    Attention,
    DecoderStack,
    GatedMLP,
    RMSNorm,
    RopeTable,
    apply_rope,
    concat_linears,
    fuse_projections,
    rope_cos_sin,
)

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

DTYPES = [torch.float32, torch.bfloat16]


def reference_rope(x, positions, head_dim, theta, dtype):
    """The reference's RoPE: unsigned tables, x * cos + rotate_half(x) * sin."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    emb = torch.cat([positions.float()[..., None] * inv_freq] * 2, dim=-1)
    cos, sin = emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]
    half = head_dim // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def reference_rms_norm(x, weight, eps):
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_with_signed_table_is_bitwise_the_reference(dtype):
    torch.manual_seed(0)
    positions = torch.arange(40).reshape(2, 20) * 7
    x = torch.randn(2, 6, 20, 128).to(dtype)
    cos, sin = rope_cos_sin(positions, 128, 1e6, dtype)
    assert torch.equal(apply_rope(x, cos, sin), reference_rope(x, positions, 128, 1e6, dtype))
    view = torch.randn(2, 20, 9, 128).to(dtype).transpose(1, 2)[:, 3:]  # a strided head slice, as in `project`
    assert torch.equal(apply_rope(view, cos, sin), reference_rope(view, positions, 128, 1e6, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_table_is_bitwise_the_tables_computed_at_the_positions(dtype):
    # 700 positions: three pieces, the last one partial; the engine's talker gathers, its predictor slices.
    table = RopeTable(700, 128, 1e6, dtype)
    assert len(table) == 700 and table.cos.dtype == dtype
    positions = torch.tensor([[0], [255], [256], [511], [699], [3]])  # (B, 1): a decode frame's rows
    cos, sin = table.at(positions)
    direct = rope_cos_sin(positions, 128, 1e6, dtype)
    assert cos.shape == (6, 1, 128) and torch.equal(cos, direct[0]) and torch.equal(sin, direct[1])
    cos, sin = table.span(2, 5, batch=3)
    direct = rope_cos_sin(torch.arange(2, 5).expand(3, 3), 128, 1e6, dtype)
    assert cos.shape == (3, 3, 128) and torch.equal(cos, direct[0]) and torch.equal(sin, direct[1])
    assert all(torch.equal(a, b) for a, b in zip(RopeTable(700, 128, 1e6, dtype).at(torch.arange(700)),
                                                  rope_cos_sin(torch.arange(700), 128, 1e6, dtype)))


def test_stack_takes_the_callers_rope_tables_and_keeps_one_table():
    from omnitts.config import DecoderConfig

    torch.manual_seed(0)
    cfg = DecoderConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4, vocab_size=16,
                        num_code_groups=4, attention_bias=False)
    stack = DecoderStack(cfg)
    x, positions = torch.randn(2, 5, 32), torch.arange(3, 8).expand(2, 5)
    table = stack.rope_table(10, torch.float32, torch.device("cpu"))
    assert stack.rope_table(6, torch.float32, torch.device("cpu")) is table  # shorter: the same table
    assert len(stack.rope_table(12, torch.float32, torch.device("cpu"))) == 12  # longer: a new one
    table = stack.rope_table(12, torch.float32, torch.device("cpu"))
    with torch.no_grad():
        assert torch.equal(stack(x, None, rope=table.span(3, 8, 2)), stack(x, positions))
        assert torch.equal(stack(x, None, rope=table.at(positions)), stack(x, positions))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_is_bitwise_the_reference(dtype):
    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-6).to(dtype)
    norm.weight.data = torch.randn(64).to(dtype)
    for shape in [(3, 1, 64), (2, 5, 4, 64)]:
        x = torch.randn(shape).to(dtype)
        kept = x.clone()
        assert torch.equal(norm(x), reference_rms_norm(x, norm.weight, 1e-6))
        assert torch.equal(x, kept)  # the in-place steps work on temporaries only
    heads = RMSNorm(64, 1e-6).to(dtype)  # a per-head weight (the fused q/k norm)
    heads.weight = nn.Parameter(torch.randn(4, 64).to(dtype))
    x = torch.randn(2, 3, 4, 64).to(dtype)
    assert torch.equal(heads(x), reference_rms_norm(x, heads.weight, 1e-6))


def random_attention(qk_norm: bool, bias: bool = False, dtype=torch.float32) -> Attention:
    torch.manual_seed(1)
    attn = Attention(48, heads=4, kv_heads=2, head_dim=16, eps=1e-6, qk_norm=qk_norm, bias=bias).to(dtype)
    for p in attn.parameters():
        p.data = torch.randn_like(p) * 0.3
    return attn


@pytest.mark.parametrize("qk_norm,bias", [(True, False), (False, True)])
def test_fused_attention_equals_the_built_one(qk_norm, bias):
    attn = random_attention(qk_norm, bias)
    fused = copy.deepcopy(attn)
    fused.fuse()
    assert fused.q_proj is None and fused.qkv_proj.weight.shape == (4 * 16 + 2 * 2 * 16, 48)
    assert (fused.qk_norm is not None) == qk_norm and fused.q_norm is None
    x = torch.randn(3, 5, 48)
    positions = torch.arange(5).expand(3, 5)
    cos, sin = rope_cos_sin(positions, 16, 1e4, torch.float32)
    for a, b in zip(fused.project(x, cos, sin), attn.project(x, cos, sin)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)  # one matrix product instead of three
    out = fused(x, cos, sin, KVCache(1), causal=True)
    torch.testing.assert_close(out, attn(x, cos, sin, KVCache(1), causal=True), rtol=1e-6, atol=1e-6)


def test_unfused_projection_is_the_reference_arithmetic():
    """The built (unfused) module's q, k, v: separate projections, per-set norms, reference RoPE."""
    attn = random_attention(qk_norm=True)
    x = torch.randn(2, 3, 48)
    positions = torch.arange(3).expand(2, 3)
    cos, sin = rope_cos_sin(positions, 16, 1e4, torch.float32)
    q, k, v = attn.project(x, cos, sin)
    q_ref = reference_rms_norm(attn.q_proj(x).view(2, 3, 4, 16), attn.q_norm.weight, 1e-6).transpose(1, 2)
    k_ref = reference_rms_norm(attn.k_proj(x).view(2, 3, 2, 16), attn.k_norm.weight, 1e-6).transpose(1, 2)
    assert torch.equal(q, reference_rope(q_ref, positions, 16, 1e4, torch.float32))
    assert torch.equal(k, reference_rope(k_ref, positions, 16, 1e4, torch.float32))
    assert torch.equal(v, attn.v_proj(x).view(2, 3, 2, 16).transpose(1, 2))


def test_fused_mlp_equals_the_built_one():
    torch.manual_seed(2)
    mlp = GatedMLP(32, 80)
    fused = copy.deepcopy(mlp)
    fused.fuse()
    assert fused.gate_proj is None and fused.gate_up_proj.weight.shape == (160, 32)
    x = torch.randn(4, 2, 32)
    torch.testing.assert_close(fused(x), mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x)),
                               rtol=1e-6, atol=1e-6)


def test_concat_linears_keeps_each_part_and_refuses_mixed_biases():
    parts = [nn.Linear(8, 3), nn.Linear(8, 5)]
    fused = concat_linears(parts)
    x = torch.randn(2, 8)
    torch.testing.assert_close(fused(x), torch.cat([m(x) for m in parts], -1), rtol=1e-6, atol=1e-6)
    with pytest.raises(AssertionError, match="mixed biases"):
        concat_linears([nn.Linear(8, 3), nn.Linear(8, 3, bias=False)])


@pytest.mark.skipif(not can_pack(torch.float32), reason="oneDNN not available in this torch build")
def test_packed_concatenation_equals_packing_the_concatenated_linear():
    """The loader's CPU path widens the parts straight into one buffer: the same packed matrix as
    packing `concat_linears`' weight, so bitwise the same outputs."""
    torch.manual_seed(3)
    parts = [nn.Linear(32, 24, bias=False), nn.Linear(32, 8, bias=False), nn.Linear(32, 8, bias=False)]
    for m in parts:  # stored bfloat16, packed in float32, as a bf16 checkpoint loaded as float32
        m.weight.data = m.weight.data.bfloat16()
    widen = Widener()
    packed = PackedLinear(parts, torch.float32, widen=widen)
    # one buffer holds the three parts side by side (float32 for oneDNN; bfloat16 for the native
    # kernel, which keeps bfloat16-stored weights and widens them as it reads)
    assert packed.out_features == 40 and [b.numel() for b in widen.buffers.values()] == [40 * 32]
    reference = PackedLinear(concat_linears(parts), torch.float32)
    x = torch.randn(3, 1, 32)
    assert torch.equal(packed(x), reference(x))


def test_fuse_projections_fuses_every_block_once():
    from omnitts.config import DecoderConfig

    cfg = DecoderConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4, vocab_size=16,
                        num_code_groups=4, attention_bias=False)
    stack = DecoderStack(cfg)
    for p in stack.parameters():
        p.data = torch.randn_like(p) * 0.3
    x = torch.randn(2, 5, 32)
    positions = torch.arange(5).expand(2, 5)
    before = stack(x, positions, KVCache(2))
    assert fuse_projections(stack) == 4 and fuse_projections(stack) == 4  # a second call changes nothing
    assert not any(n.endswith(("q_proj.weight", "gate_proj.weight")) for n, _ in stack.named_parameters())
    torch.testing.assert_close(stack(x, positions, KVCache(2)), before, rtol=1e-5, atol=1e-5)


def test_same_device_reads_a_missing_index_as_any():
    """`rope_table` keeps its table when asked for "cuda" and holding one on "cuda:0" (no rebuild per call)."""
    from omnitts.models.layers import same_device

    assert same_device(torch.device("cuda:0"), "cuda")
    assert same_device(torch.device("cuda:0"), torch.device("cuda:0"))
    assert not same_device(torch.device("cuda:1"), "cuda:0")
    assert not same_device(torch.device("cpu"), "cuda")
    assert same_device(torch.device("cpu"), "cpu")


@pytest.mark.parametrize("causal", [False, True])
def test_attention_without_sdpa_gqa_repeats_kv_heads_to_the_same_result(monkeypatch, causal):
    """torch 2.4's sdpa has no `enable_gqa`: K/V heads are repeated instead, bitwise the same attention."""
    import omnitts.models.layers as layers

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 3, 8, generator=gen), torch.randn(2, 2, 3, 8, generator=gen),
               torch.randn(2, 2, 3, 8, generator=gen))
    mask = None if causal else torch.rand(2, 1, 3, 3, generator=gen) > 0.3
    if mask is not None:
        mask[..., 0] = True  # every query sees a key
    native = layers.sdpa_attention(q, k, v, mask, causal)
    monkeypatch.setattr(layers, "SDPA_GQA", False)
    repeated = layers.sdpa_attention(q, k, v, mask, causal)
    assert torch.equal(native, repeated)
    head = F.scaled_dot_product_attention(q[:, 3:], k[:, 1:], v[:, 1:], attn_mask=mask, is_causal=causal)
    torch.testing.assert_close(repeated[:, 3:], head)  # query head 3 reads KV head 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_decode_attention_is_gqa_sdpa_without_enable_gqa(dtype, monkeypatch):
    """Accelerators' talker decode attention: the query heads of a K/V head folded into queries gives what
    sdpa with enable_gqa gives (per-row masks over a strided slot-cache view included), never asking
    sdpa for enable_gqa (CUDA's masked fused kernel lacks it); several queries go through unchanged."""
    from omnitts.models import layers

    torch.manual_seed(0)
    cache = torch.randn(2, 5, 4, 40, 32, dtype=dtype)  # (k|v, B, Hkv, capacity, D): views like the slot cache's
    k, v = cache[0][:, :, :23], cache[1][:, :, :23]
    q = torch.randn(5, 16, 1, 32, dtype=dtype)
    mask = (torch.arange(23)[None, :] <= torch.tensor([3, 22, 0, 10, 17])[:, None])[:, None, None]
    want = layers.sdpa_attention(q, k, v, mask, False)
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append(kwargs.get("enable_gqa", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", recording)
    got = layers.grouped_decode_attention(q, k, v, mask, False)
    assert calls == [False]
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
    several = torch.randn(5, 16, 3, 32, dtype=dtype)
    torch.testing.assert_close(layers.grouped_decode_attention(several, k, v, None, False),
                               layers.sdpa_attention(several, k, v, None, False), atol=0, rtol=0)


def test_accelerators_give_the_talker_the_grouped_decode_attention(ckpt_dir):
    """prepare_weights for a non-CPU device sets the talker's decode attention (laid out on CPU tensors)."""
    from omnitts.device import prepare_weights
    from omnitts.models import layers
    from omnitts.models.loader import load_models

    models = load_models(ckpt_dir("custom_voice"), torch.device("cpu"), torch.bfloat16, torch.float32)
    assert models.model.talker.model.attend is layers.sdpa_attention
    prepare_weights(models, torch.device("cuda"), torch.bfloat16, torch.float32)
    assert models.model.talker.model.attend is layers.grouped_decode_attention
