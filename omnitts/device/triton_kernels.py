"""Triton kernels behind device/fused.py's ops on CUDA: one launch each where torch runs several.

Each kernel copies the reference's roundings (models/layers.py, sampling.py): statistics and products
in float32, the result rounded to the input dtype wherever the reference rounds (a bfloat16 norm rounds
x * scale before the weight multiplies it, as `rms_norm` does). Sums over a row (the RMS) use Triton's
reduction order, so float32 values match torch's within rounding, not bitwise; the integer hashes of
the sampling noise are bitwise. Every program handles one row (or one head of one position), so a
row's result never depends on the batch it runs in. Testable on the CPU with `TRITON_INTERPRET=1`
(tests/test_fused.py). Imported lazily, on the first CUDA call of a fused op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _to(x, dtype: tl.constexpr):
    """float32 x rounded to `dtype` to nearest, ties to even, as torch rounds (bfloat16 by hand: Triton's
    interpreter truncates there, and the same bits on a GPU and in the interpreter keep the tests honest)."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)
    else:
        return x.to(dtype)


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, n, x_stride, r_stride, eps,
                     RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n
    x = tl.load(x_ptr + row * x_stride + cols, mask=inside, other=0.0)
    dtype = x.dtype
    if RESIDUAL:
        r = tl.load(r_ptr + row * r_stride + cols, mask=inside, other=0.0)
        x = _to(x.to(tl.float32) + r.to(tl.float32), dtype)  # the sum in the input dtype, as torch rounds it
        tl.store(sum_ptr + row * n + cols, x, mask=inside)
    xf = x.to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    y = _to(xf * scale, dtype).to(tl.float32) * w
    tl.store(out_ptr + row * n + cols, _to(y, dtype), mask=inside)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, n) with unit column stride (a copy only where no such view exists)."""
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def _launch_norm(x, residual, weight, eps):
    n = x.shape[-1]
    rows = _rows(x)
    res = _rows(residual) if residual is not None else rows
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else out
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](rows, res, weight, total, out, n, rows.stride(0), res.stride(0),
                                           float(eps), RESIDUAL=residual is not None,
                                           BLOCK=triton.next_power_of_2(n))
    return total, out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """layers.rms_norm for `weight` of x's dtype, one program per row."""
    return _launch_norm(x, None, weight, eps)[1]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """layers.add_rms_norm: (x + residual, rms_norm(x + residual)), one program per row."""
    return _launch_norm(x, residual, weight, eps)


@triton.jit
def _normed_rotated(base, w_ptr, cos_row, sin_row, h, D, d, inside, eps):
    """Head `h` at `base` (D values) RMS-normed by its weight row and rotated (the roll by D/2 with the signed
    sine table, as `layers.apply_rope`), in the input dtype's roundings."""
    half = D // 2
    d2 = (d + half) % D  # the rolled index: roll by D/2 is its own inverse
    x = tl.load(base + d, mask=inside, other=0.0)
    dtype = x.dtype
    xf = x.to(tl.float32)
    x2 = tl.load(base + d2, mask=inside, other=0.0).to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    w = tl.load(w_ptr + h * D + d, mask=inside, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + h * D + d2, mask=inside, other=0.0).to(tl.float32)
    y = _to(_to(xf * scale, dtype).to(tl.float32) * w, dtype).to(tl.float32)
    y2 = _to(_to(x2 * scale, dtype).to(tl.float32) * w2, dtype).to(tl.float32)
    c = tl.load(cos_row + d, mask=inside, other=0.0).to(tl.float32)
    s = tl.load(sin_row + d, mask=inside, other=0.0).to(tl.float32)
    return _to(_to(y2 * s, dtype).to(tl.float32) + _to(y * c, dtype).to(tl.float32), dtype)


@triton.jit
def _norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, T, NH, D,
                      sxb, sxt, sxh, scb, sct, ssb, sst, eps, BLOCK: tl.constexpr):
    pid = tl.program_id(0)  # one (row, position, head)
    b = pid // (T * NH)
    t = (pid // NH) % T
    h = pid % NH
    d = tl.arange(0, BLOCK)
    inside = d < D
    out = _normed_rotated(x_ptr + b * sxb + t * sxt + h * sxh, w_ptr, cos_ptr + b * scb + t * sct,
                          sin_ptr + b * ssb + t * sst, h, D, d, inside, eps)
    tl.store(out_ptr + ((b * NH + h) * T + t) * D + d, out, mask=inside)


def _rope_tables(cos, sin, b, t, d):
    """cos, sin expanded to (b, t, d) with a unit last stride."""
    cos, sin = cos.expand(b, t, d), sin.expand(b, t, d)
    return (cos if cos.stride(-1) == 1 else cos.contiguous()), (sin if sin.stride(-1) == 1 else sin.contiguous())


def norm_rope(qk: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor):
    """layers.norm_rope: q/k heads (B, T, H, D) (any strides, unit last) -> (B, H, T, D), one program per
    (row, position, head)."""
    b, t, nh, d = qk.shape
    if qk.stride(-1) != 1:
        qk = qk.contiguous()
    cos, sin = _rope_tables(cos, sin, b, t, d)
    out = torch.empty((b, nh, t, d), dtype=qk.dtype, device=qk.device)
    if out.numel():
        _norm_rope_kernel[(b * t * nh,)](qk, weight.contiguous(), cos, sin, out, t, nh, d,
                                         qk.stride(0), qk.stride(1), qk.stride(2), cos.stride(0), cos.stride(1),
                                         sin.stride(0), sin.stride(1), float(eps), BLOCK=triton.next_power_of_2(d))
    return out


@triton.jit
def _norm_rope_store_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, off_ptr, T, H, KV, D,
                            sxb, sxt, sxh, scb, sct, ssb, sst, skb, skh, sks, svb, svh, svs, eps,
                            BLOCK: tl.constexpr):
    pid = tl.program_id(0)  # one (row, position, head) over the H + 2 KV heads of the merged projection
    NH = H + 2 * KV
    b = pid // (T * NH)
    t = (pid // NH) % T
    h = pid % NH
    d = tl.arange(0, BLOCK)
    inside = d < D
    base = x_ptr + b * sxb + t * sxt + h * sxh
    if h >= H + KV:  # a value head: stored as projected
        position = tl.load(off_ptr + b) + t
        tl.store(v_ptr + b * svb + (h - H - KV) * svh + position * svs + d, tl.load(base + d, mask=inside),
                 mask=inside)
    else:
        out = _normed_rotated(base, w_ptr, cos_ptr + b * scb + t * sct, sin_ptr + b * ssb + t * sst, h, D, d,
                              inside, eps)
        if h < H:
            tl.store(q_ptr + ((b * H + h) * T + t) * D + d, out, mask=inside)
        else:
            position = tl.load(off_ptr + b) + t
            tl.store(k_ptr + b * skb + (h - H) * skh + position * sks + d, out, mask=inside)


def norm_rope_store(qkv: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                    k_dest: torch.Tensor, v_dest: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """layers.norm_rope_store: q (B, H, T, D) returned, k and v written into the caches at each row's
    offsets, one program per (row, position, head) of q, k and v."""
    b, t, nh, d = qkv.shape
    kv = k_dest.shape[1]
    h = nh - 2 * kv
    assert k_dest.stride(-1) == 1 and v_dest.stride(-1) == 1, "cache buffers with a unit last stride"
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    cos, sin = _rope_tables(cos, sin, b, t, d)
    q = torch.empty((b, h, t, d), dtype=qkv.dtype, device=qkv.device)
    if b * t:
        _norm_rope_store_kernel[(b * t * nh,)](
            qkv, weight.contiguous(), cos, sin, q, k_dest, v_dest, offsets.contiguous(), t, h, kv, d,
            qkv.stride(0), qkv.stride(1), qkv.stride(2), cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
            k_dest.stride(0), k_dest.stride(1), k_dest.stride(2), v_dest.stride(0), v_dest.stride(1),
            v_dest.stride(2), float(eps), BLOCK=triton.next_power_of_2(d))
    return q


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, n, x_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n
    gate = tl.load(x_ptr + row * x_stride + cols, mask=inside, other=0.0)
    dtype = gate.dtype
    g = gate.to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + n + cols, mask=inside, other=0.0).to(tl.float32)
    s = _to(g / (1.0 + tl.exp(-g)), dtype).to(tl.float32)
    tl.store(out_ptr + row * n + cols, _to(s * up, dtype), mask=inside)


SILU_BLOCK = 1024


def silu_mul(both: torch.Tensor) -> torch.Tensor:
    """layers.silu_mul: silu(gate) * up for both = [gate | up] on the last dimension."""
    n = both.shape[-1] // 2
    rows = _rows(both)
    out = torch.empty((*both.shape[:-1], n), dtype=both.dtype, device=both.device)
    if out.numel():
        _silu_mul_kernel[(rows.shape[0], triton.cdiv(n, SILU_BLOCK))](rows, out, n, rows.stride(0), BLOCK=SILU_BLOCK)
    return out


# -- sampling: sampling.py's integer hashes, on uint64 values kept below 2**32 ---------------------
@triton.jit
def _fmix32(h):
    m = 0xFFFFFFFF
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & m
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & m
    return h ^ (h >> 16)


@triton.jit
def _frame_keys_kernel(seed_ptr, frame_ptr, out_ptr, B, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < B
    m = 0xFFFFFFFF
    seed = tl.load(seed_ptr + i, mask=inside, other=0).to(tl.uint64, bitcast=True)
    frame = tl.load(frame_ptr + i, mask=inside, other=0).to(tl.uint64, bitcast=True)
    lo, hi = seed & m, (seed >> 32) & m
    h = _fmix32(lo ^ 0x3C6EF372)
    h = _fmix32(h ^ hi ^ 0x243F6A88)
    h = _fmix32(h ^ (frame & m) ^ 0x85A308D3)
    tl.store(out_ptr + i, h.to(tl.int64, bitcast=True), mask=inside)


def frame_keys(seed: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """sampling.frame_keys: (B, 1) int64 keys from seeds (B, 1) and frame indices (B,)."""
    seed, frame = seed.reshape(-1).contiguous(), frame.reshape(-1).contiguous()
    out = torch.empty((seed.shape[0], 1), dtype=torch.int64, device=seed.device)
    if seed.numel():
        _frame_keys_kernel[(triton.cdiv(seed.shape[0], 128),)](seed, frame, out, seed.shape[0], BLOCK=128)
    return out


@triton.jit
def _gumbel_scores_kernel(values_ptr, keep_ptr, keys_ptr, index_ptr, out_ptr, N, group_word,
                          sv, sk, si, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < N
    m = 0xFFFFFFFF
    key = tl.load(keys_ptr + row).to(tl.uint64, bitcast=True)
    index = tl.load(index_ptr + row * si + cols, mask=inside, other=0).to(tl.uint64, bitcast=True)
    counter = index + group_word
    h = _fmix32(key ^ ((counter * 0x9E3779B9) & m))
    u = ((h >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23: exact
    noise = -tl.log(-tl.log(u))
    values = tl.load(values_ptr + row * sv + cols, mask=inside, other=0.0)
    keep = tl.load(keep_ptr + row * sk + cols, mask=inside, other=0)
    scores = tl.where(keep != 0, values + noise, float("-inf"))
    tl.store(out_ptr + row * N + cols, scores, mask=inside)


def gumbel_scores(values: torch.Tensor, keep: torch.Tensor, keys: torch.Tensor, group: int,
                  index: torch.Tensor) -> torch.Tensor:
    """sampling.gumbel_scores: float32 values (B, N) + Gumbel noise of codes `index`, -inf where not `keep`."""
    values, keep, index = _rows(values), _rows(keep), _rows(index)
    keys = keys.reshape(-1).contiguous()
    out = torch.empty(values.shape, dtype=values.dtype, device=values.device)
    block = min(1024, triton.next_power_of_2(values.shape[1]))
    if out.numel():
        _gumbel_scores_kernel[(values.shape[0], triton.cdiv(values.shape[1], block))](
            values, keep.view(torch.uint8), keys, index, out, values.shape[1], group << 16,
            values.stride(0), keep.stride(0), index.stride(0), BLOCK=block)
    return out


@triton.jit
def _pick_kernel(values_ptr, index_ptr, temp_ptr, topk_ptr, keys_ptr, greedy_ptr, sample_ptr, out_ptr, K,
                 group_word, sv, si, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # one row's whole draw: K sorted candidates fit one block
    cols = tl.arange(0, BLOCK)
    inside = cols < K
    values = tl.math.div_rn(tl.load(values_ptr + row * sv + cols, mask=inside, other=0.0), tl.load(temp_ptr + row))
    k = tl.load(topk_ptr + row)
    k = tl.minimum(tl.maximum(tl.where(k <= 0, K, k), 1), K)  # off (0) or more than K: every candidate
    kth = tl.sum(tl.where(cols == k - 1, values, 0.0), axis=0)  # the k-th best (one term: exact)
    keep = inside & (values >= kth)
    m = 0xFFFFFFFF
    key = tl.load(keys_ptr + row).to(tl.uint64, bitcast=True)
    index = tl.load(index_ptr + row * si + cols, mask=inside, other=0)
    h = _fmix32(key ^ (((index.to(tl.uint64, bitcast=True) + group_word) * 0x9E3779B9) & m))
    u = ((h >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23: exact
    scores = tl.where(keep, values - tl.log(-tl.log(u)), float("-inf"))
    best = tl.argmax(scores, axis=0, tie_break_left=True)  # the first of equal maxima, as torch's argmax
    sampled = tl.sum(tl.where(cols == best, index, 0), axis=0)
    chosen = tl.where(tl.load(sample_ptr + row) != 0, sampled, tl.load(greedy_ptr + row))
    tl.store(out_ptr + row, chosen)


def pick(values, index, temperature, top_k, keys, group: int, greedy, do_sample) -> torch.Tensor:
    """sampling.draw: one code per row (B,) from sorted float32 candidates `values` (B, K) and their codes."""
    values, index = _rows(values), _rows(index)
    b, k = values.shape
    out = torch.empty((b,), dtype=torch.int64, device=values.device)
    if b:
        flat = [t.reshape(-1).contiguous() for t in (temperature, top_k, keys, greedy, do_sample)]
        _pick_kernel[(b,)](values, index, *flat[:4], flat[4].view(torch.uint8), out, k, group << 16,
                           values.stride(0), index.stride(0), BLOCK=triton.next_power_of_2(k))
    return out


# -- decode attention with a reduction order of its own row's (deterministic mode) -------------------
@triton.jit
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, len_ptr, out_ptr, H, G, D,
                             sqb, sqh, skb, skh, sks, svb, svh, svs, scale,
                             BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)  # one (row, query head)
    b = pid // H
    h = pid % H
    kv = h // G
    d = tl.arange(0, BLOCK_D)
    inside = d < D
    query = tl.load(q_ptr + b * sqb + h * sqh + d, mask=inside, other=0.0)
    dtype = query.dtype
    q = query.to(tl.float32)
    n = tl.load(len_ptr + b)
    m = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(0, n, BLOCK_N):  # this row's own keys only, in blocks from key 0: the same order in any batch
        keys = start + tl.arange(0, BLOCK_N)
        valid = keys < n
        both = valid[:, None] & inside[None, :]
        k = tl.load(k_ptr + b * skb + kv * skh + keys[:, None] * sks + d[None, :], mask=both, other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_ptr + b * svb + kv * svh + keys[:, None] * svs + d[None, :], mask=both, other=0.0)
        total = total * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m = m_new
    out = acc / total
    tl.store(out_ptr + (b * H + h) * D + d, _to(out, dtype), mask=inside)


DECODE_BLOCK = 64


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """One query per row: q (B, H, 1, D) over its row's first `lengths[b]` (>= 1) keys of k/v (B, Hkv, S, D)
    (query head h reads K/V head h // (H / Hkv)) -> (B, H, 1, D).

    One program per (row, head) walks the row's own keys in blocks of DECODE_BLOCK from key 0, with the
    online softmax in float32: a row's result depends on its keys and nothing else (not the batch, not S,
    not the other rows' lengths), bit for bit."""
    b, h, t, d = q.shape
    assert t == 1, "decode_attention takes one query per row"
    kv = k.shape[1]
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    if q.stride(-1) != 1:
        q = q.contiguous()
    lengths = lengths.reshape(-1).to(torch.int32).contiguous()
    out = torch.empty((b, h, 1, d), dtype=q.dtype, device=q.device)
    if out.numel():
        _decode_attention_kernel[(b * h,)](q, k, v, lengths, out, h, h // kv, d, q.stride(0), q.stride(1),
                                           k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
                                           v.stride(2), d ** -0.5, BLOCK_D=triton.next_power_of_2(d),
                                           BLOCK_N=DECODE_BLOCK)
    return out
