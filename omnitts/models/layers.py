"""Building blocks shared by the talker, the code predictor and the codec transformer.

Pure tensor code with checkpoint parameter names (`q_proj`, `input_layernorm`, ...). Attention takes
its key/value history from a cache the caller owns (models/kv_cache.py: `KVCache` grows, `StaticKVCache`
has a fixed shape; the engine's slot cache is preallocated), and its kernel is a plain function argument
(`attend`, default `sdpa_attention`), so a device backend can swap the kernel without the model
knowing about devices. A `DecoderStack` keeps its default kernel in `attend` (the CPU loader sets
`float32_attention` there for bfloat16 models, see device/cpu_weights.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMS normalisation computed in float32, then scaled in the input dtype (as the reference does)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        # `kernel(x, weight, eps)`: the same computation fused, where a device layer provides one
        # (device/cpu_weights.use_native_norms); used for inputs of the weight's dtype.
        self.kernel = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and x.dtype == self.weight.dtype:
            return self.kernel(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`RMSNorm`'s arithmetic as a function (the fused device ops' reference, device/fused.py)."""
    dtype = x.dtype
    x = x.float()
    scale = x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    x = (x * scale).to(dtype)
    # In place where the product keeps x's dtype: the same values as `weight * x`, one buffer fewer.
    return x.mul_(weight) if weight.dtype == dtype else weight * x


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """A residual add and the next norm: (x + residual, rms_norm(x + residual)), the `DecoderStack.add_norm`
    hook's contract."""
    x = x + residual
    return x, rms_norm(x, weight, eps)


def norm_rope(qk: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor):
    """q/k heads (B, T, H, D) normed per head (`weight` (H, D)) and rotated -> (B, H, T, D): the
    `Attention.rope_kernel` hook's contract, computed as the unhooked path does."""
    return apply_rope(rms_norm(qk, weight, eps).transpose(1, 2), cos, sin)


def norm_rope_store(qkv: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                    k_dest: torch.Tensor, v_dest: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The merged projection's output `qkv` (B, T, H + 2 Hkv, D) to attention's inputs in one step: q (B, H, T,
    D) normed and rotated is returned; k, normed and rotated, and v are written into the caches `k_dest` and
    `v_dest` (B, Hkv, S, D), row b's T positions from `offsets[b]` on. The `Attention.store_kernel` hook's
    contract: `norm_rope` and the cache writes, the same values."""
    b, t, _, _ = qkv.shape
    kv = k_dest.shape[1]
    h = qkv.shape[2] - 2 * kv
    qk = norm_rope(qkv[:, :, : h + kv], weight, eps, cos, sin)  # (B, H + Hkv, T, D)
    positions = offsets[:, None] + torch.arange(t, device=offsets.device)  # (B, T)
    rows = torch.arange(b, device=offsets.device)[:, None]
    k_dest[rows, :, positions] = qk[:, h:].transpose(1, 2)  # (B, T, Hkv, D) at (row, position)
    v_dest[rows, :, positions] = qkv[:, :, h + kv:]
    return qk[:, :h]


def silu_mul(both: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for `both` = [gate | up] on the last dimension: the `GatedMLP.kernel` hook's contract."""
    gate, up = both.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """Rotary tables at integer `positions` (any shape) -> cos, signed sin, each (*positions.shape, head_dim).

    Computed in float32 whatever the model dtype, then cast, like the reference. The sin table comes
    with its first half negated, the form `apply_rope` takes (see there).
    """
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)
    freqs = positions.float().unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin()
    half = head_dim // 2
    return emb.cos().to(dtype), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).to(dtype)


def same_device(have: torch.device, want) -> bool:
    """Whether a tensor on `have` is on `want`, where `want` may omit the index ("cuda" means the
    current device, and a tensor made there reports "cuda:0")."""
    want = torch.device(want)
    if have.type != want.type:
        return False
    return want.index is None or have.index is None or have.index == want.index


class RopeTable:
    """`rope_cos_sin` at positions 0..length-1, computed once: `at(positions)` gathers rows and
    `span(start, stop, batch)` gives views of a run of positions, bitwise equal to computing the
    tables for those positions (each entry is a function of its own position alone).

    Built in pieces of 256 positions so that no piece is split between threads: the elementwise
    sin/cos then take the same vectorised path as a direct call on a few positions.
    """

    PIECE = 256

    def __init__(self, length: int, head_dim: int, theta: float, dtype: torch.dtype, device=None):
        pieces = [rope_cos_sin(torch.arange(i, min(i + self.PIECE, length), device=device), head_dim, theta,
                               torch.float32) for i in range(0, length, self.PIECE)]
        # Cast after joining, as `rope_cos_sin(..., dtype)` casts its float32 result.
        self.cos = torch.cat([c for c, _ in pieces]).to(dtype)
        self.sin = torch.cat([s for _, s in pieces]).to(dtype)

    def __len__(self) -> int:
        return self.cos.shape[0]

    def at(self, positions: torch.Tensor):
        """cos, sin (*positions.shape, D) at integer `positions` (each < len(self))."""
        return self.cos[positions], self.sin[positions]

    def span(self, start: int, stop: int, batch: int):
        """cos, sin (batch, stop - start, D) at positions start..stop-1 for every row: views, no copy."""
        cos, sin = self.cos[start:stop], self.sin[start:stop]
        return cos.expand(batch, *cos.shape), sin.expand(batch, *sin.shape)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` (B, H, T, D) by `rope_cos_sin`'s tables (B, T, D).

    The reference computes x * cos + cat(-x2, x1) * sin; here the sign lives in the table, so the
    rotation is a plain roll: roll(x) * signed_sin + x * cos, the same products and sum (IEEE
    negation is exact), bitwise equal, in fewer kernels.
    """
    out = torch.roll(x, x.shape[-1] // 2, -1).mul_(sin.unsqueeze(1))
    return out.add_(x * cos.unsqueeze(1))


def _sdpa_takes_enable_gqa() -> bool:
    """Whether this torch's sdpa has `enable_gqa` (torch 2.5 added it), tried once on a tiny input."""
    x = torch.zeros(1, 2, 1, 2)
    try:
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
    except TypeError:
        return False
    return True


SDPA_GQA = _sdpa_takes_enable_gqa()


def sdpa_attention(q, k, v, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """The default kernel: q (B, H, T, D), k/v (B, Hkv, S, D), `mask` boolean broadcastable to
    (B, H, T, S) with True = attend -> (B, H, T, D).

    enable_gqa: each KV head serves its query group without materialising repeated K/V; a torch
    without it (2.4) gets the K/V heads repeated, the same products per head.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and not SDPA_GQA:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          **({"enable_gqa": groups > 1} if SDPA_GQA else {}))


def prefix_decode_attention(q, k, v, lengths: torch.Tensor) -> torch.Tensor:
    """One query per row over its row's first `lengths[b]` keys: q (B, H, 1, D), k/v (B, Hkv, S, D) -> (B, H,
    1, D). The torch code of the fused `decode_attention` op (device/fused.py; on CUDA a Triton kernel whose
    sums a row's batch mates and S cannot change)."""
    keys = torch.arange(k.shape[2], device=k.device)
    mask = (keys[None, :] < lengths.reshape(-1, 1))[:, None, None]  # (B, 1, 1, S)
    return grouped_decode_attention(q, k, v, mask, False)


def grouped_decode_attention(q, k, v, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """`sdpa_attention` with one query per row (decode) computed as plain multi-head attention: the G query
    heads that share a K/V head become G queries of that head, q (B, H, 1, D) -> (B, Hkv, G, D).

    The same products and sums per query (head h uses K/V head h // G either way), without `enable_gqa`:
    on CUDA, torch's memory-efficient kernel (the one that takes a boolean mask) does not support
    `enable_gqa`, so a masked GQA call falls back to the math kernel (K/V repeated, scores materialised,
    several launches). A per-row mask (B, 1, 1, S) broadcasts over the G queries unchanged. Other calls
    (several queries, no groups) go to `sdpa_attention` as they are.
    """
    b, h, t, d = q.shape
    hkv = k.shape[1]
    if t != 1 or h == hkv:
        return sdpa_attention(q, k, v, mask, causal)
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, h // hkv, d), k, v, attn_mask=mask)
    return out.reshape(b, h, 1, d)


def float32_attention(q, k, v, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """`sdpa_attention` computed in float32 and cast back to q's dtype (identical for float32 inputs).

    For bfloat16 models on CPUs: torch's bfloat16 CPU attention kernel runs 3-4x slower than its
    float32 one at decode shapes (one query per row, a few to a few hundred keys), more than the
    cost of widening the K/V views, and float32 scores are also the more accurate.
    """
    if q.dtype == torch.float32:
        return sdpa_attention(q, k, v, mask, causal)
    return sdpa_attention(q.float(), k.float(), v.float(), mask, causal).to(q.dtype)


class Attention(nn.Module):
    """Grouped-query self-attention with optional per-head q/k RMSNorm (Qwen3) and rotary positions.

    Built with the checkpoint's separate projections and norms; `fuse()` (the loader calls it, see
    `fuse_projections`) merges them into one `qkv_proj` and one `qk_norm` over the q and k heads
    together, which computes the same values in a third of the kernel calls.
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float,
                 qk_norm: bool = True, bias: bool = False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        else:
            self.q_norm = self.k_norm = None
        self.qkv_proj = self.qk_norm = None  # set by `fuse`
        # `rope_kernel(qk, weight, eps, cos, sin)`: `apply_rope(qk_norm(qk).transpose(1, 2), cos, sin)`
        # fused, where a device layer provides one (device/cpu_weights.use_native_rope); used once fused,
        # for inputs of the norm weight's dtype.
        self.rope_kernel = None
        # `store_kernel(qkv, weight, eps, cos, sin, k_dest, v_dest, offsets) -> q`: the rope kernel that also
        # writes k and v into the cache (`norm_rope_store`'s contract), where a device layer provides one and
        # the cache offers its buffers (`store_target`): two cache writes fewer per layer.
        self.store_kernel = None

    def fuse(self, concat=None) -> None:
        """Replace q/k/v_proj by `qkv_proj = concat([q, k, v])` (default `concat_linears`) and the q/k
        norms by one norm whose weight is each head's own. Same outputs; not undone."""
        if self.qkv_proj is not None:
            return
        self.qkv_proj = (concat or concat_linears)([self.q_proj, self.k_proj, self.v_proj])
        self.q_proj = self.k_proj = self.v_proj = None
        if self.q_norm is not None:
            d = self.head_dim
            weight = torch.cat((self.q_norm.weight.detach().expand(self.heads, d),
                                self.k_norm.weight.detach().expand(self.kv_heads, d)))
            self.qk_norm = RMSNorm(d, self.q_norm.eps)
            self.qk_norm.weight = nn.Parameter(weight, requires_grad=False)
            self.qk_norm.kernel = self.q_norm.kernel
            self.q_norm = self.k_norm = None

    def project(self, x: torch.Tensor, cos, sin):
        """x (B, T, hidden) -> q (B, H, T, D), k and v (B, Hkv, T, D): projected, normed, rotated."""
        b, t, _ = x.shape
        h, hk, d = self.heads, self.kv_heads, self.head_dim
        norm = self.qk_norm
        if self.qkv_proj is not None:
            qk, v = self._heads(x).split((h + hk, hk), dim=2)
            if self.rope_kernel is not None and norm is not None and qk.dtype == norm.weight.dtype == cos.dtype:
                qk = self.rope_kernel(qk, norm.weight, norm.eps, cos, sin)  # normed, (B, H + Hkv, T, D), rotated
            else:
                qk = apply_rope((norm(qk) if norm is not None else qk).transpose(1, 2), cos, sin)
        else:  # unfused (a module used as built, not loaded)
            q, k = self.q_proj(x).view(b, t, h, d), self.k_proj(x).view(b, t, hk, d)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            qk, v = torch.cat((q, k), dim=2), self.v_proj(x).view(b, t, hk, d)
            qk = apply_rope(qk.transpose(1, 2), cos, sin)
        return qk[:, :h], qk[:, h:], v.transpose(1, 2)

    def forward(self, x, cos, sin, cache=None, layer: int = 0,
                mask: torch.Tensor | None = None, causal: bool = False, attend=sdpa_attention):
        """x (B, T, hidden) -> (B, T, hidden); `cache` is one of models/kv_cache.py's (None: no history).
        `mask` is boolean (B|1, 1, T, S), True = attend;
        `attend(q, k, v, mask, causal)` is the kernel (see `sdpa_attention`)."""
        b, t, _ = x.shape
        target = self._store_target(cache, layer, t, x, cos)
        if target is not None:  # q from the kernel; k and v straight into the cache
            norm = self.qk_norm
            q = self.store_kernel(self._heads(x), norm.weight, norm.eps, cos, sin, *target)
            k, v = cache.stored(layer, t)
        else:
            q, k, v = self.project(x, cos, sin)
            if cache is not None:
                k, v = cache.update(layer, k, v)
        out = attend(q, k, v, mask, causal and mask is None and t > 1)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """The merged projection of x (B, T, hidden) as heads (B, T, H + 2 Hkv, D): q, k, then v."""
        b, t, _ = x.shape
        return self.qkv_proj(x).view(b, t, self.heads + 2 * self.kv_heads, self.head_dim)

    def _store_target(self, cache, layer: int, t: int, x: torch.Tensor, cos: torch.Tensor):
        """(k_dest, v_dest, offsets) for `store_kernel`, or None: the projection and `cache.update` instead."""
        if self.store_kernel is None or self.qkv_proj is None or self.qk_norm is None or cache is None:
            return None
        if not x.dtype == self.qk_norm.weight.dtype == cos.dtype:
            return None
        store = getattr(cache, "store_target", None)
        return store(layer, t, x.dtype) if store is not None else None


class GatedMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)); `fuse()` merges gate and up into `gate_up_proj`."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_up_proj = None  # set by `fuse`
        # `kernel(x)`: silu(gate) * up for x = gate_up_proj's output [gate | up], the same arithmetic fused,
        # where a device layer provides one (device/cpu_weights.use_native_swiglu).
        self.kernel = None

    def fuse(self, concat=None) -> None:
        """Replace gate/up_proj by `gate_up_proj = concat([gate, up])` (default `concat_linears`)."""
        if self.gate_up_proj is None:
            self.gate_up_proj = (concat or concat_linears)([self.gate_proj, self.up_proj])
            self.gate_proj = self.up_proj = None

    def forward(self, x):
        if self.gate_up_proj is not None:
            both = self.gate_up_proj(x)
            return self.down_proj(self.kernel(both) if self.kernel is not None else silu_mul(both))
        return self.down_proj(F.silu(self.gate_proj(x)).mul_(self.up_proj(x)))


def concat_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One `nn.Linear` whose outputs are those of `linears` side by side (weights stacked by rows)."""
    weight = torch.cat([m.weight.detach() for m in linears])
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta", dtype=weight.dtype)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    fused.bias = concat_biases(linears)
    return fused


def concat_biases(linears: list[nn.Linear]) -> nn.Parameter | None:
    """The biases of `linears` side by side (one linear: its own); None where they have none (all or none must)."""
    biases = [m.bias for m in linears]
    assert all(b is None for b in biases) or all(b is not None for b in biases), "mixed biases"
    if len(biases) == 1 or biases[0] is None:
        return biases[0]
    return nn.Parameter(torch.cat([b.detach() for b in biases]), requires_grad=False)


def fuse_projections(module: nn.Module, concat=None) -> int:
    """`fuse()` every `Attention` and `GatedMLP` under `module` (linears merged by `concat`, default
    `concat_linears`; the CPU loader packs them for oneDNN as it merges); returns how many."""
    blocks = [m for m in module.modules() if isinstance(m, (Attention, GatedMLP))]
    for block in blocks:
        block.fuse(concat)
    return len(blocks)


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                   cfg.head_dim, cfg.rms_norm_eps, qk_norm=True, bias=cfg.attention_bias)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache=None, layer=0, mask=None, causal=False, attend=sdpa_attention):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, mask, causal, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """`layers` + final `norm`; runs a chunk of new positions against the cache."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attend = sdpa_attention  # the kernel when a call names none
        # The dtype callers keep this stack's K/V history in, when wider than the model's (set together
        # with a widening kernel, see device/cpu_weights.use_cpu_attention); None: the model's.
        self.kv_dtype: torch.dtype | None = None
        # `add_norm(x, residual, weight, eps) -> (x + residual, norm(x + residual))` (`add_rms_norm`'s
        # contract): each residual add fused into the norm after it, where a device layer provides one
        # (device/fused.py); used for inputs of the norms' dtype.
        self.add_norm = None
        self._rope_table: RopeTable | None = None

    def rope_table(self, length: int, dtype: torch.dtype, device) -> RopeTable:
        """This stack's rotary tables for positions 0..length-1 (at least), made once and kept."""
        table = self._rope_table
        if (table is None or len(table) < length or table.cos.dtype != dtype
                or not same_device(table.cos.device, device)):
            table = self._rope_table = RopeTable(length, self.cfg.head_dim, self.cfg.rope_theta, dtype, device)
        return table

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None, cache=None,
                mask: torch.Tensor | None = None, attend=None, rope=None) -> torch.Tensor:
        """x (B, T, H) at `positions` (B, T). Without `mask`, attention is causal over cache + x.
        `attend` is the attention kernel of every layer (see `sdpa_attention`; default `self.attend`).
        `rope`: the rotary tables (cos, sin) at `positions`, when the caller has them (a `RopeTable`'s);
        `positions` is then not read."""
        attend = attend or self.attend
        if rope is None:
            rope = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        cos, sin = rope
        causal = mask is None and (cache is None or cache.length == 0)
        assert mask is not None or causal or x.shape[1] == 1, "several new positions after a cache need a mask"
        if self.add_norm is not None and x.dtype == self.norm.weight.dtype:
            return self._fused_residuals(x, cos, sin, cache, mask, causal, attend)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, mask, causal, attend)
        return self.norm(x)

    def _fused_residuals(self, x, cos, sin, cache, mask, causal, attend) -> torch.Tensor:
        """The layers with each residual add taken by the norm that follows it (`add_norm`): the same
        sums and norms as `DecoderLayer.forward`, in one call each instead of an add and a norm."""
        norms = [norm for layer in self.layers for norm in (layer.input_layernorm, layer.post_attention_layernorm)]
        norms.append(self.norm)
        h = norms[0](x)
        for i, layer in enumerate(self.layers):
            out = layer.self_attn(h, cos, sin, cache, i, mask, causal, attend)
            x, h = self.add_norm(x, out, norms[2 * i + 1].weight, norms[2 * i + 1].eps)
            x, h = self.add_norm(x, layer.mlp(h), norms[2 * i + 2].weight, norms[2 * i + 2].eps)
        return h
