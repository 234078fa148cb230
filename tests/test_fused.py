"""The fused device ops (device/fused.py): the torch reference they run off CUDA is the models' own code
bit for bit, the Triton kernels they run on CUDA match it (checked here under TRITON_INTERPRET=1, skipped
where triton is not installed), and a 0.6B-shaped frame at batch 8 launches at most 1,100 kernels on the
GPU path's stand-in (testing/opcount.py) with codes unchanged, graphs and eager, greedy and seeded."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from omnitts import sampling
from omnitts.device import fused
from omnitts.testing import opcount
from omnitts.device.fake import FakeGraphBackend
from omnitts.engine import Engine, EngineConfig
from omnitts.engine.reference import generate_codes
from omnitts.models import layers
from omnitts.request import Request
from omnitts.testing import checkpoint as checkpoints

OPS = fused.OPS
ON_GPU = torch.cuda.is_available()
if not ON_GPU and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read once, when triton is first imported
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = [torch.float32, torch.bfloat16]


# -- the reference implementation (every device but CUDA) -------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_ops_off_cuda_are_the_models_torch_code_bitwise(dtype):
    x, r, w = torch.randn(3, 2, 100).to(dtype), torch.randn(3, 2, 100).to(dtype), torch.randn(100).to(dtype)
    norm = layers.RMSNorm(100, 1e-6).to(dtype).requires_grad_(False)
    norm.weight.copy_(w)
    assert torch.equal(OPS.rms_norm(x, w, 1e-6), norm(x))
    total, normed = OPS.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(total, x + r) and torch.equal(normed, layers.rms_norm(x + r, w, 1e-6))
    qk, wh = torch.randn(2, 3, 6, 16).to(dtype), torch.randn(6, 16).to(dtype)
    cos, sin = layers.rope_cos_sin(torch.arange(3)[None].expand(2, 3), 16, 1e6, dtype)
    want = layers.apply_rope(layers.rms_norm(qk, wh, 1e-6).transpose(1, 2), cos, sin)
    assert torch.equal(OPS.norm_rope(qk, wh, 1e-6, cos, sin), want)
    both = torch.randn(4, 1, 60).to(dtype)
    assert torch.equal(OPS.silu_mul(both), torch.nn.functional.silu(both[..., :30]) * both[..., 30:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 2])
def test_norm_rope_store_off_cuda_is_norm_rope_and_the_cache_writes_bitwise(dtype, t):
    """q as `norm_rope` returns it; k (normed, rotated) and v written at each row's own positions, nothing
    else in the caches touched (the talker's frames: rows at different positions; the predictor: one)."""
    heads, kv, d = 4, 2, 16
    qkv = torch.randn(3, t, heads + 2 * kv, d).to(dtype)
    w = torch.randn(heads + kv, d).to(dtype)
    cos, sin = layers.rope_cos_sin(torch.tensor([[3, 4], [0, 1], [6, 7]])[:, :t], d, 1e6, dtype)
    k_cache, v_cache = torch.randn(3, kv, 9, d).to(dtype), torch.randn(3, kv, 9, d).to(dtype)
    offsets = torch.tensor([3, 0, 6])
    k_want, v_want = k_cache.clone(), v_cache.clone()
    qk = layers.norm_rope(qkv[:, :, : heads + kv], w, 1e-6, cos, sin)
    for row, start in enumerate(offsets.tolist()):
        k_want[row, :, start:start + t] = qk[row, heads:]
        v_want[row, :, start:start + t] = qkv[row, :, heads + kv:].transpose(0, 1)
    q = OPS.norm_rope_store(qkv, w, 1e-6, cos, sin, k_cache, v_cache, offsets)
    assert torch.equal(q, qk[:, :heads]) and torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)


def test_fused_sampling_ops_off_cuda_are_samplings_code_bitwise():
    seed, frame = torch.tensor([[3], [-7], [2**62 + 1]]), torch.tensor([0, 5, 2**31 + 3])
    keys = OPS.frame_keys(seed, frame)
    assert torch.equal(keys, sampling.frame_keys(seed, frame))
    values, index = torch.topk(torch.randn(3, 2048), 64)
    keep = values >= values[:, 9:10]
    scores = OPS.gumbel_scores(values, keep, keys, 4, index)
    assert torch.equal(scores, (values + sampling.gumbel(keys, 4, index)).masked_fill(~keep, float("-inf")))


# -- the Triton kernels, interpreted on the CPU ------------------------------------------------------
@pytest.fixture(scope="module")
def kernels():
    """device/triton_kernels.py, compiled on a GPU, else interpreted on the CPU (TRITON_INTERPRET, set at
    this module's import: the interpreter must be chosen before triton's first import)."""
    reason = fused.triton_available()
    if reason is not None:
        pytest.skip(f"{reason}: the Triton kernels (CUDA's fused ops) are not checked here")
    if not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set: run tests/test_fused.py alone")
    if not ON_GPU and not _interpreter_takes_constexpr_blocks():
        import triton

        pytest.skip(f"triton {triton.__version__}'s interpreter passes constexpr block sizes as arrays (3.0 does); "
                    "the kernels are checked where a newer Triton is installed (CI's newest stack)")
    import omnitts.device.triton_kernels as module

    return module


def _interpreter_takes_constexpr_blocks() -> bool:
    """Whether this Triton's interpreter runs a kernel with a `tl.constexpr` block size, as the compiler does."""
    import triton
    import triton.language as tl

    @triton.jit
    def _fill(out_ptr, BLOCK: tl.constexpr):
        tl.store(out_ptr + tl.arange(0, BLOCK), tl.arange(0, BLOCK))

    out = torch.zeros(4, dtype=torch.int32)
    try:
        _fill[(1,)](out, BLOCK=4)
    except Exception:  # noqa: BLE001 - triton 3.0: InterpreterError(ValueError("arange's arguments ..."))
        return False
    return out.tolist() == [0, 1, 2, 3]


def close(got, want, dtype):
    """float32: within a few ulps (another summation order for the RMS); bfloat16: within one ulp."""
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=2 ** -7)
    torch.testing.assert_close(got.float(), want.float(), **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [16, 100, 1000])  # 100 and 1000: not powers of two (masked tails)
def test_triton_norms_match_torch_and_rows_do_not_depend_on_the_batch(kernels, dtype, width):
    x, r, w = ((torch.randn(6, width) * 3).to(DEVICE, dtype), torch.randn(6, width).to(DEVICE, dtype),
               torch.randn(width).to(DEVICE, dtype))
    close(kernels.rms_norm(x, w, 1e-6), layers.rms_norm(x, w, 1e-6), dtype)
    total, normed = kernels.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(total, x + r)  # the sum is rounded once, as torch rounds it
    close(normed, layers.rms_norm(x + r, w, 1e-6), dtype)
    assert torch.equal(kernels.rms_norm(x[2:3], w, 1e-6), kernels.rms_norm(x, w, 1e-6)[2:3])
    assert torch.equal(kernels.add_rms_norm(x[4:5], r[4:5], w, 1e-6)[1], normed[4:5])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_triton_norm_rope_matches_torch_and_rows_do_not_depend_on_the_batch(kernels, dtype, head_dim):
    heads, kv = 4, 2
    # The engine's layout: q/k heads a strided view of the merged projection's output, v after them.
    qkv = (torch.randn(3, 2, heads + 2 * kv, head_dim) * 2).to(DEVICE, dtype)
    qk = qkv[:, :, : heads + kv]
    w = torch.randn(heads + kv, head_dim).to(DEVICE, dtype)
    table = layers.RopeTable(8, head_dim, 1e6, dtype, DEVICE)
    cos, sin = table.at(torch.tensor([[1, 2], [5, 6], [0, 1]], device=DEVICE))
    got = kernels.norm_rope(qk, w, 1e-6, cos, sin)
    close(got, layers.norm_rope(qk, w, 1e-6, cos, sin), dtype)
    assert torch.equal(kernels.norm_rope(qk[1:2], w, 1e-6, cos[1:2], sin[1:2]), got[1:2])
    span_cos, span_sin = table.span(0, 2, 3)  # expanded views (stride 0)
    close(kernels.norm_rope(qk, w, 1e-6, span_cos, span_sin), layers.norm_rope(qk, w, 1e-6, span_cos, span_sin),
          dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [16, 128])
def test_triton_norm_rope_store_matches_torch_and_writes_only_its_positions(kernels, dtype, head_dim):
    heads, kv, t = 4, 2, 2
    qkv = (torch.randn(3, t, heads + 2 * kv, head_dim) * 2).to(DEVICE, dtype)
    w = torch.randn(heads + kv, head_dim).to(DEVICE, dtype)
    table = layers.RopeTable(16, head_dim, 1e6, dtype, DEVICE)
    cos, sin = table.at(torch.tensor([[5, 6], [0, 1], [9, 10]], device=DEVICE))
    offsets = torch.tensor([5, 0, 9], device=DEVICE)
    caches = [[torch.randn(4, kv, 12, head_dim).to(DEVICE, dtype)[:3] for _ in range(2)]]  # views: rows 0..2
    caches.append([c.clone() for c in caches[0]])
    got = kernels.norm_rope_store(qkv, w, 1e-6, cos, sin, *caches[0], offsets)
    want = layers.norm_rope_store(qkv, w, 1e-6, cos, sin, *caches[1], offsets)
    assert torch.equal(got, kernels.norm_rope(qkv[:, :, :heads + kv], w, 1e-6, cos, sin)[:, :heads])
    close(got, want, dtype)
    close(caches[0][0], caches[1][0], dtype)  # the keys: the same kernel's rounding as `norm_rope`'s
    assert torch.equal(caches[0][1], caches[1][1])  # the values: copied
    written = torch.zeros(3, 12, dtype=torch.bool)
    for row, start in enumerate(offsets.tolist()):
        written[row, start:start + t] = True
    untouched = ~written.to(DEVICE)[:, None, :, None].expand_as(caches[1][0])
    assert torch.equal(caches[0][0][untouched], caches[1][0][untouched])  # nothing else written
    assert torch.equal(kernels.norm_rope_store(qkv[1:2], w, 1e-6, cos[1:2], sin[1:2], caches[0][0][1:2],
                                               caches[0][1][1:2], offsets[1:2]), got[1:2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [16, 1500])  # 1500: more than one block per row, a masked tail
def test_triton_silu_mul_matches_torch_and_rows_do_not_depend_on_the_batch(kernels, dtype, width):
    both = (torch.randn(5, 1, 2 * width) * 3).to(DEVICE, dtype)
    got = kernels.silu_mul(both)
    close(got, layers.silu_mul(both), dtype)
    assert torch.equal(kernels.silu_mul(both[3:4]), got[3:4])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,heads,kv", [(128, 16, 8), (64, 4, 1), (24, 4, 4), (16, 8, 2)])
def test_triton_decode_attention_matches_torch_and_a_row_does_not_depend_on_batch_span_or_mates(kernels, dtype,
                                                                                              head_dim, heads, kv):
    """Deterministic mode's decode attention: close to the masked sdpa it replaces, and a row's bits are the
    same alone, in a batch of rows of other lengths, over a longer cache (another span bucket), and with
    other values in the keys past its length (the last block's masked lanes) or in its mates' rows."""
    g = torch.Generator().manual_seed(head_dim + heads)
    span, lengths = 200, torch.tensor([1, 64, 65, 130, 200, 7])
    q = torch.randn(6, heads, 1, head_dim, generator=g).to(DEVICE, dtype)
    k = (torch.randn(6, kv, span, head_dim, generator=g) * 2).to(DEVICE, dtype)
    v = torch.randn(6, kv, span, head_dim, generator=g).to(DEVICE, dtype)
    n = lengths.to(DEVICE)
    got = kernels.decode_attention(q, k, v, n)
    want = layers.prefix_decode_attention(q, k, v, n)  # sums in another order: within rounding of it
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -6, atol=2 ** -6)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), **tol)
    for row in range(6):
        alone = kernels.decode_attention(q[row:row + 1], k[row:row + 1], v[row:row + 1], n[row:row + 1])
        assert torch.equal(alone, got[row:row + 1]), row
        width = int(lengths[row])  # only its own keys, a cache no longer than them
        short = kernels.decode_attention(q[row:row + 1], k[row:row + 1, :, :width].contiguous(),
                                         v[row:row + 1, :, :width].contiguous(), n[row:row + 1])
        assert torch.equal(short, alone), row
    longer_k = torch.cat([k, torch.randn(6, kv, 56, head_dim, generator=g).to(DEVICE, dtype)], dim=2)
    longer_v = torch.cat([v, torch.randn(6, kv, 56, head_dim, generator=g).to(DEVICE, dtype)], dim=2)
    assert torch.equal(kernels.decode_attention(q, longer_k, longer_v, n), got)
    shuffled = torch.tensor([3, 0, 5, 1])  # other mates, other order
    assert torch.equal(kernels.decode_attention(q[shuffled], k[shuffled], v[shuffled], n[shuffled]), got[shuffled])


def test_triton_sampling_kernels_hash_bitwise_and_score_as_torch(kernels):
    seed = torch.tensor([[0], [1], [-5], [2**62 + 7], [sampling.seed_word(2**64 - 1)]], device=DEVICE)
    frame = torch.tensor([0, 3, 100, 2**31 + 5, 7], device=DEVICE)
    keys = kernels.frame_keys(seed, frame)
    assert torch.equal(keys, sampling.frame_keys(seed, frame))  # integer hashes: the same bits
    values, index = torch.topk(torch.randn(5, 3072, device=DEVICE), 1100)  # more codes than one block
    keep = values >= values[:, 40:41]
    for group in (0, 1, 15):
        got, want = kernels.gumbel_scores(values, keep, keys, group, index), sampling.gumbel_scores(values, keep, keys,
                                                                                                    group, index)
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        torch.testing.assert_close(got[keep], want[keep], rtol=1e-6, atol=1e-6)  # `log`'s last ulp may differ
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        assert torch.equal(kernels.gumbel_scores(values[2:3], keep[2:3], keys[2:3], group, index[2:3]), got[2:3])


@pytest.mark.parametrize("candidates", [16, 128, 3072])  # the plans' K: top-k 1..8, 50, off (the vocabulary)
def test_triton_pick_draws_torchs_codes_and_rows_do_not_depend_on_the_batch(kernels, candidates):
    g = torch.Generator().manual_seed(candidates)
    rows = 6
    values, index = torch.topk(torch.randn(rows, 3072, generator=g) * 3, candidates)
    values, index = values.to(DEVICE), index.to(DEVICE)
    temperature = torch.tensor([[0.9], [1.0], [0.3], [1.7], [0.9], [1.0]], device=DEVICE)
    top_k = torch.tensor([[50], [0], [1], [5000], [7], [50]], device=DEVICE)  # off, one, more than K
    keys = sampling.frame_keys(torch.arange(rows, device=DEVICE)[:, None] * 7919, torch.full((rows,), 3,
                                                                                              device=DEVICE))
    greedy = index[:, 0] + 1  # marks the rows that do not sample
    do_sample = torch.tensor([True, True, True, True, False, True], device=DEVICE)
    for group in (0, 15):
        args = (values, index, temperature, top_k, keys, group, greedy, do_sample)
        got = kernels.pick(*args)
        want = sampling.draw(*args)
        assert torch.equal(got, want) and torch.equal(OPS.pick(*args).cpu(), want.cpu())
        assert got[4] == greedy[4] and got[2] == index[2, 0]  # not sampling; top-k 1
        alone = kernels.pick(*(a[3:4] if isinstance(a, torch.Tensor) else a for a in args))
        assert torch.equal(alone, got[3:4])


def test_choose_with_the_pick_kernel_is_choose_without_it_and_top_p_keeps_the_long_way():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 2048, generator=g) * 4
    args = (torch.tensor([True, False, True, True]), torch.tensor([[0.8], [1.0], [1.2], [0.5]]),
            torch.tensor([[50], [50], [0], [3]]), torch.tensor([[0.9], [1.0], [0.7], [1.0]]),
            sampling.frame_keys(torch.tensor([[1], [2], [3], [4]]), torch.tensor([0, 1, 2, 3])), 4)
    calls = []

    def pick(*a):
        calls.append(a)
        return sampling.draw(*a)
    for plan in (sampling.Plan(128, False), sampling.Plan(2048, False), sampling.Plan(128, True)):
        calls.clear()
        want = sampling.choose(logits, *args, plan)
        assert torch.equal(sampling.choose(logits, *args, plan, pick=pick), want)
        assert len(calls) == (0 if plan.top_p else 1)


# -- kernels per frame -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def layers_06b(tmp_path_factory):
    return checkpoints.build_checkpoint(tmp_path_factory.mktemp("layers") / "ck", preset="layers-0.6b")


def test_a_06b_frame_at_batch_8_launches_at_most_1500_kernels_on_the_gpu_path(layers_06b):
    fused_count = opcount.count_frame(layers_06b, fused=True, sampled=True)
    plain = opcount.count_frame(layers_06b, fused=False, sampled=True)
    assert fused_count.batch == plain.batch == 8
    assert fused_count.kernels <= 1500, fused_count.summary()
    assert plain.kernels > 3500, plain.summary()  # the counter sees the unfused frame's ~4,200
    # 28 talker layers + 5 predictor layers x 15 forwards: every norm is one fused op, none left in pieces, and
    # each layer's q/k norm and rotary also writes its keys and values into the cache (no write of their own).
    assert fused_count.ops["omnitts_fused.norm_rope_store"] == 28 + 5 * 15
    assert fused_count.ops["omnitts_fused.norm_rope"] == 0 and fused_count.ops["index_put_"] == 0
    assert fused_count.ops["copy_"] <= 5 and plain.ops["copy_"] + plain.ops["index_put_"] >= 2 * (28 + 5 * 15)
    assert fused_count.ops["pow"] == fused_count.ops["rsqrt_"] == 0 and plain.ops["pow"] == 325
    assert fused_count.ops["omnitts_fused.pick"] == 16 and fused_count.ops["gather"] == 0  # each draw one op
    assert fused_count.kernels <= 1100, fused_count.summary()  # 1,072 measured


def test_the_op_count_does_not_depend_on_widths(tmp_path, monkeypatch):
    wide = dict(checkpoints.PRESETS["tiny-0.6b"], talker=(96, 192, 2, 8, 4, 32), predictor=(96, 192, 2, 8, 4, 32))
    monkeypatch.setitem(checkpoints.PRESETS, "tiny-wide", wide)
    counts = [opcount.count_frame(checkpoints.build_checkpoint(tmp_path / preset, preset=preset), batch=3)
              for preset in ("tiny-0.6b", "tiny-wide")]
    assert counts[0].ops == counts[1].ops and counts[0].views == counts[1].views


@pytest.mark.parametrize("greedy", [True, False])
def test_fused_ops_leave_values_and_codes_unchanged_graphs_and_eager(ckpt_dir, greedy):
    path = ckpt_dir("custom_voice")
    plain, with_ops = opcount.load_generic(path, fused=False), opcount.load_generic(path, fused=True)
    assert with_ops.ckpt.model.talker.model.add_norm is not None and plain.ckpt.model.talker.model.add_norm is None
    # Bitwise, not only codes (random weights give decisive margins): the talker's and the predictor's stacks.
    talkers = [tts.ckpt.model.talker for tts in (with_ops, plain)]
    for stacks in ([t.model for t in talkers], [t.code_predictor.model for t in talkers]):
        x = torch.randn(2, 5, stacks[0].cfg.hidden_size)
        positions = torch.arange(5)[None].expand(2, 5)
        with torch.inference_mode():
            assert torch.equal(stacks[0](x, positions), stacks[1](x, positions))
    texts = ["Short one.", "A somewhat longer sentence for the batch.", "你好，今天怎么样？"]

    def run(tts, backend):
        engine = Engine(tts.ckpt, EngineConfig(max_num_seqs=3, max_positions=96), backend=backend)
        for i, text in enumerate(texts):
            params = tts.default_params(greedy, max_frames=6 + 3 * i, seed=40 + i)
            engine.add(tts.prompts.build(Request(text, speaker="ryan")), params, tag=i)
        done = {}
        while engine.has_work():
            done.update({seq.tag: seq.codes() for seq in engine.step()})
        return [done[i] for i in range(len(texts))]

    want = run(plain, None)
    for backend in (None, FakeGraphBackend()):
        got = run(with_ops, backend)
        assert all((a == b).all() for a, b in zip(got, want))
    # The slow path takes the same hooks.
    params = with_ops.default_params(greedy, max_frames=5, seed=9)
    prompt = with_ops.prompts.build(Request(texts[1], speaker="ryan"))
    slow = [generate_codes(tts.ckpt, prompt, params).codes for tts in (with_ops, plain)]
    assert torch.equal(*slow)


def test_frames_writing_their_keys_through_the_fused_kernel_leave_the_caches_and_state_bitwise(ckpt_dir):
    """The store path (`Attention.store_kernel`: the talker's frames into the slot cache at each row's position,
    the predictor's steps into its frame cache) against `cache.update`: after prefill and four frames of three
    rows at different lengths, every K/V buffer, hidden state and logit is the same, bit for bit."""
    path = ckpt_dir("custom_voice")
    engines, stored = [], []
    for fused_ops in (True, False):
        tts = opcount.load_generic(path, fused=fused_ops)
        attentions = [m for m in tts.ckpt.model.modules() if isinstance(m, layers.Attention)]
        assert all((m.store_kernel is not None) == fused_ops for m in attentions)
        for m in attentions:
            if m.store_kernel is not None:
                m.store_kernel = (lambda kernel: lambda *args: stored.append(args[-1].shape) or kernel(*args))(
                    m.store_kernel)
        engine = Engine(tts.ckpt, EngineConfig(max_num_seqs=3, max_positions=96))
        for i, text in enumerate(["Short one.", "A somewhat longer sentence for the batch.", "你好"]):
            engine.add(tts.prompts.build(Request(text, speaker="ryan")), tts.default_params(i != 1, max_frames=9,
                                                                                            seed=i), tag=i)
        for _ in range(4):
            engine.step()
        engines.append(engine)
    assert len(stored) >= 4 * len(attentions)  # every layer of every frame stored its keys itself
    fused_engine, plain_engine = engines
    for a, b in zip(fused_engine.cache.tensors() + fused_engine.runner.predictor_cache.k,
                    plain_engine.cache.tensors() + plain_engine.runner.predictor_cache.k):
        assert torch.equal(a, b)
    for a, b in zip(fused_engine.state.written(), plain_engine.state.written()):
        assert torch.equal(a, b)


def test_cuda_gets_the_fused_ops_except_in_float32_unless_told(monkeypatch):
    monkeypatch.delenv("OMNITTS_FUSED", raising=False)
    assert fused.wanted(torch.bfloat16) and fused.wanted(torch.float16) and not fused.wanted(torch.float32)
    monkeypatch.setenv("OMNITTS_FUSED", "0")
    assert not fused.wanted(torch.bfloat16)
    monkeypatch.setenv("OMNITTS_FUSED", "1")
    assert fused.wanted(torch.float32)


def test_the_load_time_self_check_passes_the_kernels_and_names_a_broken_one(kernels):
    """On a GPU the Triton kernels are first compiled and run at load by `fused.self_check`; a kernel that
    raises or computes something else is named (the device layer then warns and keeps torch's kernels)."""
    import types

    for dtype in DTYPES:
        assert fused.self_check(DEVICE, dtype, kernels) is None
    broken = types.SimpleNamespace(**{name: getattr(kernels, name) for name in fused._SCHEMAS})
    broken.norm_rope = lambda qk, w, eps, cos, sin: layers.norm_rope(qk, w, eps, cos, sin) * 1.05
    assert fused.self_check(DEVICE, torch.bfloat16, broken).startswith("AssertionError: norm_rope")
    broken = types.SimpleNamespace(**{name: getattr(kernels, name) for name in fused._SCHEMAS})
    broken.silu_mul = lambda both: (_ for _ in ()).throw(RuntimeError("PTX: unsupported .version 9.9\nmore"))
    assert fused.self_check(DEVICE, torch.bfloat16, broken) == "RuntimeError: PTX: unsupported .version 9.9"
    broken = types.SimpleNamespace(**{name: getattr(kernels, name) for name in fused._SCHEMAS})

    def misplaced(qkv, w, eps, cos, sin, k_dest, v_dest, offsets):  # values written one position late
        return kernels.norm_rope_store(qkv, w, eps, cos, sin, k_dest, v_dest, offsets + 1)
    broken.norm_rope_store = misplaced
    assert fused.self_check(DEVICE, torch.bfloat16, broken).startswith("norm_rope_store: v written")
    broken = types.SimpleNamespace(**{name: getattr(kernels, name) for name in fused._SCHEMAS})
    broken.frame_keys = lambda seed, frame: sampling.frame_keys(seed, frame) + 1
    assert fused.self_check(DEVICE, torch.bfloat16, broken).startswith("frame_keys")


def test_the_deterministic_check_passes_the_kernel_and_names_a_broken_one(kernels):
    """Deterministic mode's load-time proof (device.make_deterministic): the real kernel passes; one whose row
    depends on its batch mates, or that computes something else, is named."""
    assert fused.deterministic_check(DEVICE, torch.bfloat16, kernels) is None

    class Mates:  # a row's result shifted by its batch's size: what cuBLAS-style shape heuristics can do
        @staticmethod
        def decode_attention(q, k, v, lengths):
            return kernels.decode_attention(q, k, v, lengths) * (1 + 2 ** -20 * (q.shape[0] > 1))  # ~1 ulp

    class Wrong:
        @staticmethod
        def decode_attention(q, k, v, lengths):
            return kernels.decode_attention(q, k, v, lengths.clamp(max=8))

    assert "differs from the same row in a batch" in fused.deterministic_check(DEVICE, torch.float32, Mates)
    assert "not close" in fused.deterministic_check(DEVICE, torch.float32, Wrong)
