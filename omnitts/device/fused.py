"""Fused device ops for the generic torch path: fewer kernels per frame on GPUs.

On a GPU every non-view aten op of a captured frame is one kernel launch, and a 0.6B frame at batch 8
ran ~4,200 of them (RMSNorm alone: six small kernels, 325 times a frame; docs/performance.md). The ops registered here
under `torch.ops.omnitts_fused` are each one kernel on CUDA (a Triton kernel, device/triton_kernels.py)
and, everywhere else, exactly the torch code the models run without them (models/layers.py's
`rms_norm`, `add_rms_norm`, `norm_rope`, `silu_mul`: the same values bit for bit):

  - `rms_norm(x, weight, eps)`: `RMSNorm` (the `RMSNorm.kernel` hook);
  - `add_rms_norm(x, residual, weight, eps) -> (x + residual, rms_norm(x + residual))`: a residual add
    and the norm after it (the `DecoderStack.add_norm` hook);
  - `norm_rope(qk, weight, eps, cos, sin)`: per-head q/k RMSNorm and rotary positions (the
    `Attention.rope_kernel` hook);
  - `norm_rope_store(qkv, weight, eps, cos, sin, k_dest, v_dest, offsets) -> q`: the same, with k and v
    written into the K/V cache by the same kernel (`layers.norm_rope_store`; the `Attention.store_kernel`
    hook, taken while decoding: the talker's frames, the code predictor's steps);
  - `silu_mul(both)`: SwiGLU's silu(gate) * up (the `GatedMLP.kernel` hook);
  - `frame_keys(seed, frame)` and `gumbel_scores(values, keep, keys, group, index)`: sampling's
    counter-based noise keys of a frame (~40 integer ops) and a codebook's Gumbel-max scores (noise,
    sum and mask: ~25 ops, 16 times a frame) (the `Talker.frame_keys` / `Talker.gumbel_scores` hooks);
  - `pick(values, index, temperature, top_k, keys, group, greedy, do_sample)`: a codebook's whole draw
    from its sorted candidates when no row filters by top-p (`sampling.draw`: temperature, top-k, the
    Gumbel race, the winner's code or the greedy one: ~10 ops) (the `Talker.pick` hook);
  - `decode_attention(q, k, v, lengths)`: one query per row over its own first `lengths` keys
    (`layers.prefix_decode_attention`), in a reduction order that depends on nothing but the row: the
    decode attention of deterministic mode (`deterministic_attention`, the decoder stacks' `attend` hook).

The namespace is not `omnitts`: omnitts' native CPU library (native.py) registers `omnitts::rms_norm`
and others from C++, and a second registration of a name aborts the process.

`use_fused_ops(module)` wires them into a talker: the device layer calls it for CUDA where `wanted`
(bfloat16 and float16 runs; float32 runs are the parity runs and keep torch's arithmetic, as they keep
TF32 off: the Triton norms sum in another order, ~1 ulp apart). The CPU keeps its native kernels, and
without them plain torch: there the ops would only add dispatcher overhead (docs/performance.md).
Each op is registered for the CompositeExplicitAutograd key, so a TorchDispatchMode (the op counter,
testing/opcount.py; the CPU fake's trace) sees one op where a GPU launches one kernel. Triton is imported
on the first CUDA call, never at `import omnitts`.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
from torch import nn

from .. import sampling
from ..models import layers

_LIB = torch.library.Library("omnitts_fused", "DEF")  # kept alive: dropping it would unregister the ops
_SCHEMAS = {
    "rms_norm": "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor",
    "add_rms_norm": "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
    "norm_rope": "norm_rope(Tensor qk, Tensor weight, float eps, Tensor cos, Tensor sin) -> Tensor",
    "norm_rope_store": "norm_rope_store(Tensor qkv, Tensor weight, float eps, Tensor cos, Tensor sin, "
                       "Tensor(a!) k_dest, Tensor(b!) v_dest, Tensor offsets) -> Tensor",
    "silu_mul": "silu_mul(Tensor both) -> Tensor",
    "frame_keys": "frame_keys(Tensor seed, Tensor frame) -> Tensor",
    "gumbel_scores": "gumbel_scores(Tensor values, Tensor keep, Tensor keys, int group, Tensor index) -> Tensor",
    "decode_attention": "decode_attention(Tensor q, Tensor k, Tensor v, Tensor lengths) -> Tensor",
    "pick": "pick(Tensor values, Tensor index, Tensor temperature, Tensor top_k, Tensor keys, int group, "
            "Tensor greedy, Tensor do_sample) -> Tensor",
}


_TORCH = {
    "rms_norm": layers.rms_norm,
    "add_rms_norm": lambda x, residual, weight, eps: tuple(layers.add_rms_norm(x, residual, weight, eps)),
    "norm_rope": layers.norm_rope,
    "norm_rope_store": layers.norm_rope_store,
    "silu_mul": layers.silu_mul,
    "frame_keys": sampling.frame_keys,
    "gumbel_scores": sampling.gumbel_scores,
    "decode_attention": layers.prefix_decode_attention,
    "pick": sampling.draw,
}


@functools.cache
def triton_available() -> str | None:
    """None where Triton imports, else why not (one line)."""
    try:
        import triton  # noqa: F401
    except Exception as error:  # ImportError, or a broken install raising at import
        return f"triton is not importable ({type(error).__name__}: {error})"
    return None


@functools.cache
def _cuda_kernels():
    """device/triton_kernels.py, or None (with one warning) where Triton is missing."""
    reason = triton_available()
    if reason is not None:
        warnings.warn(f"omnitts: {reason}; the fused CUDA ops run torch's kernels (more launches per frame)",
                      RuntimeWarning, stacklevel=2)
        return None
    from . import triton_kernels

    return triton_kernels


def _cuda(name: str):
    """The CUDA implementation of op `name`: the Triton kernel, or the torch code where Triton is missing."""
    def run(*args):
        kernels = _cuda_kernels()
        return getattr(kernels, name)(*args) if kernels is not None else _TORCH[name](*args)
    return run


for _name, _schema in _SCHEMAS.items():
    _LIB.define(_schema)
    _LIB.impl(_name, _TORCH[_name], "CompositeExplicitAutograd")
    _LIB.impl(_name, _cuda(_name), "CUDA")

OPS = torch.ops.omnitts_fused


def wanted(dtype: torch.dtype) -> bool:
    """Whether a CUDA model computing in `dtype` gets the fused ops: `OMNITTS_FUSED=1` / `0` forces the
    choice (0: the kill switch while the Triton kernels await their first GPU run), else all but float32."""
    switch = os.environ.get("OMNITTS_FUSED")
    if switch in ("0", "1"):
        return switch == "1"
    return dtype != torch.float32


def _tolerance(dtype: torch.dtype) -> dict:
    """How far a load-time check lets a kernel's values be from torch's: a few ulps of `dtype`."""
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -6, atol=2 ** -6)


def self_check(device, dtype: torch.dtype, kernels=None) -> str | None:
    """Run each Triton kernel once on small inputs on `device` against the torch code it replaces: None where
    all agree (integer hashes bitwise, values within a few ulps of `dtype`), else what failed, in one line.

    The kernels are checked on the CPU under Triton's interpreter only; on a GPU they are compiled for the
    first time here, at load, so a kernel that does not compile or computes something else costs a warning
    and torch's kernels (`prepare_generic`), never a run. `kernels`: the module to check (a test's stand-in).
    """
    if kernels is None:
        if triton_available() is not None:
            return None  # the ops run torch's code there: nothing to check (`_cuda_kernels` warns once)
        from . import triton_kernels as kernels
    try:
        g = torch.Generator().manual_seed(0)

        def rand(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g) * scale).to(device, dtype)

        tol = _tolerance(dtype)
        x, r, w = rand(4, 1, 100, scale=3), rand(4, 1, 100), rand(100)
        qk, wh = rand(4, 1, 6, 32, scale=2), rand(6, 32)
        table = layers.RopeTable(8, 32, 1e6, dtype, device)
        cos, sin = table.at(torch.arange(4, device=device)[:, None])
        both = rand(4, 1, 300, scale=3)
        pairs = [("rms_norm", kernels.rms_norm(x, w, 1e-6), layers.rms_norm(x, w, 1e-6)),
                 ("add_rms_norm", kernels.add_rms_norm(x, r, w, 1e-6)[1], layers.add_rms_norm(x, r, w, 1e-6)[1]),
                 ("norm_rope", kernels.norm_rope(qk, wh, 1e-6, cos, sin), layers.norm_rope(qk, wh, 1e-6, cos, sin)),
                 ("silu_mul", kernels.silu_mul(both), layers.silu_mul(both))]
        qkv = rand(4, 1, 8, 32, scale=2)  # 4 q heads, 2 k, 2 v: written at rows' own positions
        first = [rand(4, 2, 5, 32) for _ in range(2)]
        caches = [first, [c.clone() for c in first]]
        offsets = torch.tensor([0, 4, 2, 1], device=device)
        q_got = kernels.norm_rope_store(qkv, wh, 1e-6, cos, sin, *caches[0], offsets)
        q_want = layers.norm_rope_store(qkv, wh, 1e-6, cos, sin, *caches[1], offsets)
        pairs += [("norm_rope_store (q)", q_got, q_want), ("norm_rope_store (k)", caches[0][0], caches[1][0])]
        if not torch.equal(caches[0][1], caches[1][1]):
            return "norm_rope_store: v written other than torch writes it"
        for name, got, want in pairs:
            torch.testing.assert_close(got.float(), want.float(), **tol, msg=lambda m, name=name: f"{name}: {m}")
        seed = torch.tensor([[1], [-5], [2**62 + 7]], device=device)
        frame = torch.tensor([0, 3, 2**31 + 5], device=device)
        keys = kernels.frame_keys(seed, frame)
        if not torch.equal(keys, sampling.frame_keys(seed, frame)):
            return "frame_keys: the noise keys differ from torch's"
        values, index = torch.topk(torch.randn(3, 600, generator=g).to(device), 100)
        keep = values >= values[:, 20:21]
        got, want = kernels.gumbel_scores(values, keep, keys, 3, index), sampling.gumbel_scores(values, keep, keys, 3,
                                                                                                index)
        if not torch.equal(got.argmax(-1), want.argmax(-1)):
            return "gumbel_scores: the sampled codes differ from torch's"
        draw = (values, index, torch.tensor([[0.7], [1.0], [1.3]], device=device),
                torch.tensor([[5], [0], [60]], device=device), keys, 3, index[:, 0],
                torch.tensor([True, True, False], device=device))
        if not torch.equal(kernels.pick(*draw), sampling.draw(*draw)):
            return "pick: the sampled codes differ from torch's"
    except Exception as error:  # noqa: BLE001 - any failure (compile, launch, values) means: do not use them
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None


def deterministic_check(device, dtype: torch.dtype, kernels=None) -> str | None:
    """Deterministic mode's proof on this device: the decode attention kernel within rounding of the torch code
    it replaces, and a row's result bitwise the same alone, beside other rows of other lengths and over a
    longer cache. None where it holds, else what failed (one line). Needs Triton (`kernels`: a test's
    stand-in for device/triton_kernels.py)."""
    if kernels is None:
        reason = triton_available()
        if reason is not None:
            return reason
        from . import triton_kernels as kernels
    try:
        g = torch.Generator().manual_seed(1)
        q = torch.randn(5, 8, 1, 64, generator=g).to(device, dtype)
        k = (torch.randn(5, 2, 150, 64, generator=g) * 2).to(device, dtype)
        v = torch.randn(5, 2, 150, 64, generator=g).to(device, dtype)
        lengths = torch.tensor([1, 64, 65, 150, 9], device=device)
        got = kernels.decode_attention(q, k, v, lengths)
        tol = _tolerance(dtype)
        torch.testing.assert_close(got.float(), layers.prefix_decode_attention(q, k, v, lengths).float(), **tol)
        for row in range(5):
            n = int(lengths[row])
            alone = kernels.decode_attention(q[row:row + 1], k[row:row + 1, :, :n], v[row:row + 1, :, :n],
                                             lengths[row:row + 1])
            if not torch.equal(alone, got[row:row + 1]):
                return f"decode_attention: row {row} alone differs from the same row in a batch"
    except Exception as error:  # noqa: BLE001 - any failure (compile, launch, values) means: no deterministic mode
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None


def use_fused_ops(module: nn.Module) -> int:
    """Give every decoder stack under `module` the fused ops through the models' hooks (norms, residual
    adds, q/k norm + rotary, SwiGLU) where no kernel is set yet (the CPU's native ones stay); returns how
    many hooks were set."""
    from ..models.talker import Talker

    count = 0
    for m in module.modules():
        if isinstance(m, Talker) and m.gumbel_scores is None:
            m.frame_keys, m.gumbel_scores, m.pick, count = OPS.frame_keys, OPS.gumbel_scores, OPS.pick, count + 3
        elif isinstance(m, layers.RMSNorm) and m.kernel is None:
            m.kernel, count = OPS.rms_norm, count + 1
        elif isinstance(m, layers.Attention) and m.rope_kernel is None and m.qkv_proj is not None \
                and m.qk_norm is not None:
            m.rope_kernel, m.store_kernel, count = OPS.norm_rope, OPS.norm_rope_store, count + 2
        elif isinstance(m, layers.GatedMLP) and m.kernel is None and m.gate_up_proj is not None:
            m.kernel, count = OPS.silu_mul, count + 1
        elif isinstance(m, layers.DecoderStack) and m.add_norm is None:
            m.add_norm, count = OPS.add_rms_norm, count + 1
    return count


def deterministic_attention(q, k, v, mask, causal):
    """The `attend` kernel of deterministic mode: one-query calls (decode: the talker's frames over the slot
    cache, the code predictor's steps over its frame cache) through `decode_attention`, the rest (prefill:
    one prompt per call, so no batch mates) through `layers.grouped_decode_attention`.

    A decode mask is a prefix per row (keys 0..position, `ModelRunner.frame`): its count of True is the
    row's length, an exact integer sum. Whatever span bucket the frame's graph attends over and whoever
    shares the batch, a row then sums its own keys in the same order."""
    b, _, t, _ = q.shape
    if t != 1 or causal:
        return layers.grouped_decode_attention(q, k, v, mask, causal)
    if mask is None:
        lengths = torch.full((b,), k.shape[2], dtype=torch.int32, device=q.device)
    else:
        lengths = mask.reshape(mask.shape[0], -1).sum(-1, dtype=torch.int32).expand(b)
    return OPS.decode_attention(q, k, v, lengths)
