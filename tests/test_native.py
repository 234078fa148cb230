"""omnitts' native CPU kernels: the linear computes what nn.Linear does, bitwise independent of the
batch; RMSNorm, the fused q/k norm and rotation, silu(gate) * up and SnakeBeta what the modules do; built once per source/torch/CPU, and optional (oneDNN and torch
take over where they cannot be built)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from omnitts.device import native
from omnitts.device.cpu_weights import PackedLinear

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

needs_f32 = pytest.mark.skipif(not native.available(torch.float32), reason="native kernel not built here")


def _kernel(x, linear, dtype):
    packed = torch.ops.omnitts.pack_linear(linear.weight.detach(), dtype)
    bias = None if linear.bias is None else linear.bias.detach()
    return torch.ops.omnitts.linear(x, packed, linear.out_features, bias)


@needs_f32
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 40])
@pytest.mark.parametrize("out_features", [16, 40, 64, 100, 257])  # whole panels, tails, whole and partial groups
@pytest.mark.parametrize("bias", [True, False])
def test_float32_matches_a_float64_product(rows, out_features, bias):
    torch.manual_seed(rows * 1000 + out_features)
    linear = nn.Linear(67, out_features, bias=bias)  # odd input width: no k tail assumptions
    x = torch.randn(rows, 67)
    expected = x.double() @ linear.weight.detach().double().T
    if bias:
        expected += linear.bias.detach().double()
    got = _kernel(x, linear, torch.float32)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@needs_f32
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(dtype):
    """Each output is one sum over k in order, however rows and panels are tiled or threaded."""
    if not native.available(dtype):
        pytest.skip(f"no native {dtype} kernel on this CPU")
    torch.manual_seed(1)
    torch.set_num_threads(2)  # threaded as a user's process is (conftest puts one thread back)
    linear = nn.Linear(128, 200).to(dtype)
    packed = torch.ops.omnitts.pack_linear(linear.weight.detach(), dtype)
    x = torch.randn(23, 128).to(dtype)
    batched = torch.ops.omnitts.linear(x, packed, 200, linear.bias.detach())
    for rows in (1, 2, 3, 7, 11):
        for start in range(0, 23 - rows + 1, 5):
            part = torch.ops.omnitts.linear(x[start:start + rows], packed, 200, linear.bias.detach())
            assert torch.equal(part, batched[start:start + rows]), (rows, start)


@pytest.mark.skipif(not native.available(torch.bfloat16), reason="no native bfloat16 kernel on this CPU")
@pytest.mark.parametrize("rows", [1, 4, 9])
def test_bfloat16_matches_float_arithmetic_rounded_once(rows):
    """bfloat16 in, float32 sums, bias added in float32, one rounding to bfloat16 at the end."""
    torch.manual_seed(rows)
    linear = nn.Linear(96, 72).to(torch.bfloat16)
    x = torch.randn(rows, 96).to(torch.bfloat16)
    expected = (x.double() @ linear.weight.detach().double().T + linear.bias.detach().double()).float()
    got = _kernel(x, linear, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    # exact sums rounded once: within half a bfloat16 step of the float32 value, plus float32 sum noise
    torch.testing.assert_close(got.float(), expected.bfloat16().float(), rtol=8e-3, atol=1e-4)
    assert (got.float() - expected).abs().max() <= (expected.abs().max() * 2 ** -8 + 1e-4)


def _amx() -> bool:
    return native.amx()


needs_amx = pytest.mark.skipif(not _amx(), reason="no AMX here (or OMNITTS_AMX=0): bfloat16 runs the VDPBF16PS tiles")


@needs_amx
@pytest.mark.parametrize("depth, out_features", [(1024, 200), (40, 72), (72, 33), (34, 17), (96, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_bfloat16_on_amx_is_the_exact_sum_rounded_once_as_the_vdpbf16ps_tiles_compute_it(depth, out_features, bias):
    """AMX tiles: k in chunks of 32 (a tail of fewer, zero-padded), rows in blocks of 16, panels two or four at
    a time; every shape rounds the exact sum once, as the VDPBF16PS tiles (`amx=False`) do, in another order
    (an ulp apart at most)."""
    torch.manual_seed(depth * 7 + out_features)
    linear = nn.Linear(depth, out_features, bias=bias).to(torch.bfloat16)
    packed = torch.ops.omnitts.pack_linear(linear.weight.detach(), torch.bfloat16)
    b = None if linear.bias is None else linear.bias.detach()
    for rows in (1, 3, 16, 17, 33, 50):
        x = torch.randn(rows, depth).to(torch.bfloat16)
        expected = x.double() @ linear.weight.detach().double().T + (b.double() if bias else 0)
        amx = torch.ops.omnitts.linear(x, packed, out_features, b)
        tiles = torch.ops.omnitts.linear(x, packed, out_features, b, False)
        assert amx.dtype == torch.bfloat16 and amx.shape == (rows, out_features)
        assert (amx.double() - expected).abs().max() <= expected.abs().max() * 2 ** -8 + 1e-4, rows
        # Apart by the two orders' float32 rounding (at most 2 K 2^-24 of the sum of |products|), then one
        # bfloat16 rounding each: an ulp.
        orders = 2 * depth * 2 ** -24 * (x.double().abs() @ linear.weight.detach().double().abs().T)
        ulp = tiles.double().abs() * 2 ** -7
        assert ((amx.double() - tiles.double()).abs() <= ulp + orders).all(), rows


@needs_amx
@pytest.mark.parametrize("depth, out_features", [(72, 72), (128, 200)])  # a k tail and an odd panel; neither
def test_a_row_gets_the_same_bits_alone_and_in_any_batch_on_amx(depth, out_features):
    """One block of rows takes the four-panel path, more take two blocks by two panels, the last block is
    padded: a row's bits are the same in each."""
    torch.manual_seed(depth)
    torch.set_num_threads(2)
    linear = nn.Linear(depth, out_features).to(torch.bfloat16)
    packed = torch.ops.omnitts.pack_linear(linear.weight.detach(), torch.bfloat16)
    x = torch.randn(50, depth).to(torch.bfloat16)
    batched = torch.ops.omnitts.linear(x, packed, out_features, linear.bias.detach())
    for rows in (1, 5, 16, 17, 33):
        for start in range(0, 50 - rows + 1, 11):
            part = torch.ops.omnitts.linear(x[start:start + rows], packed, out_features, linear.bias.detach())
            assert torch.equal(part, batched[start:start + rows]), (rows, start)


@needs_amx
def test_omnitts_amx_0_keeps_the_vdpbf16ps_tiles():
    code = ("import torch; from omnitts.device import native; assert native.available(torch.bfloat16); "
            "print(native.amx())")
    for value, expected in (("0", "False"), ("1", "True")):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "OMNITTS_AMX": value})
        assert done.stdout.strip() == expected, (value, done.stderr[-2000:])


@needs_f32
def test_packed_linear_uses_the_native_kernel_and_falls_back_to_onednn(monkeypatch):
    torch.manual_seed(2)
    linear = nn.Linear(48, 80)
    x = torch.randn(3, 5, 48)
    fast = PackedLinear(linear)
    monkeypatch.setattr(native, "available", lambda dtype: False)
    fallback = PackedLinear(linear)
    assert fast.native and not fallback.native
    assert "native" in repr(fast) and "oneDNN" in repr(fallback)
    torch.testing.assert_close(fast(x), linear(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fallback(x), linear(x), rtol=1e-5, atol=1e-5)


@needs_f32
def test_the_kernel_refuses_mismatched_inputs():
    linear = nn.Linear(32, 20)
    packed = torch.ops.omnitts.pack_linear(linear.weight.detach(), torch.float32)
    with pytest.raises(RuntimeError, match="does not match input size"):
        torch.ops.omnitts.linear(torch.randn(2, 31), packed, 20, None)
    with pytest.raises(RuntimeError, match="input is"):
        torch.ops.omnitts.linear(torch.randn(2, 32, dtype=torch.float64), packed, 20, None)
    with pytest.raises(RuntimeError, match="bias has"):
        torch.ops.omnitts.linear(torch.randn(2, 32), packed, 20, torch.zeros(19))
    with pytest.raises(RuntimeError, match="even input size"):
        torch.ops.omnitts.pack_linear(torch.randn(4, 31), torch.bfloat16)


def test_the_build_is_keyed_by_source_torch_and_cpu(monkeypatch):
    key = native._digest()
    assert key == native._digest()
    monkeypatch.setattr(native, "_cpu_identity", lambda: "model name: some other CPU\nflags: fpu sse2")
    assert native._digest() != key


def test_the_build_target_is_a_switch_and_part_of_the_key(monkeypatch):
    monkeypatch.delenv("OMNITTS_NATIVE_MARCH", raising=False)
    monkeypatch.delenv("OMNITTS_CPU_PROFILE", raising=False)  # scripts/cpu_profiles.py runs the suite under each
    assert native.flags()[0] == "-march=native"
    key = native._digest()
    monkeypatch.setenv("OMNITTS_NATIVE_MARCH", "haswell")
    assert native.flags()[0] == "-march=haswell" and native.flags()[1:] == native.FLAGS
    assert native._digest() != key  # an AVX2 build never shares a cache entry with this CPU's own


def test_the_cache_folder_variable_takes_a_tilde(tmp_path, monkeypatch):
    """OMNITTS_CACHE_DIR="~/builds" (quoted, or a Dockerfile's ENV: no shell expands it) built the kernels into a
    folder named `~` in the current directory; `~` is the home folder, as in every path omnitts takes."""
    from omnitts.cache import cache_root

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("OMNITTS_CACHE_DIR", "~/builds")
    assert cache_root() == tmp_path / "builds"
    monkeypatch.delenv("OMNITTS_CACHE_DIR")
    assert cache_root() == tmp_path / ".cache" / "omnitts"


def test_a_bad_build_target_is_named_in_the_error(tmp_path, monkeypatch):
    if not native.available(torch.float32):
        pytest.skip("no C++ compiler here")
    monkeypatch.setenv("OMNITTS_NATIVE_MARCH", "no-such-cpu")
    with pytest.raises(native.BuildError, match="OMNITTS_NATIVE_MARCH='no-such-cpu'"):
        native.build(tmp_path / "omnitts_native.so")


def test_a_failed_build_says_why_and_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    target = tmp_path / "x" / "omnitts_native.so"
    with pytest.raises(native.BuildError, match="exited 1"):
        native.build(target)
    assert list(target.parent.iterdir()) == []  # no half-written library


def _environ_without_native_switch() -> dict:
    """This process's environment less OMNITTS_NATIVE: each case sets the switch it tests, whatever the
    shell that runs the suite exported."""
    import os

    return {k: v for k, v in os.environ.items() if k != "OMNITTS_NATIVE"}


@pytest.mark.parametrize("env, warned", [({"CXX": "/nonexistent/g++"}, ["compiler '/nonexistent/g++' not found"]),
                                         ({"OMNITTS_NATIVE": "0"}, [])], ids=["no-compiler", "native-off"])
def test_without_native_kernels_onednn_computes_and_auto_on_a_bf16_cpu_synthesizes(ckpt_dir, tmp_path, env, warned):
    """No compiler, or OMNITTS_NATIVE=0, in a fresh process (a process keeps the library it loaded): no kernel,
    one warning saying why (none for the switch), nothing cached, and packed linears still compute
    nn.Linear's result through oneDNN. Then, on a CPU with native bf16, `auto` is bfloat16 for the language
    models with the float32 codec of a non-parity run, and every layer runs on oneDNN and torch (the codec's
    set-up once asked the unloaded library whether it vectorises float32, and the load died). One process
    per case checks both: each start imports torch and omnitts."""
    import json
    import subprocess
    import sys

    script = (
        "import json, warnings, torch\n"
        "from torch import nn\n"
        "from omnitts.device import native\n"
        "from omnitts.device.cpu_weights import PackedLinear\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    have = [native.available(torch.float32), native.available(torch.bfloat16)]\n"
        "linear = nn.Linear(24, 40)\n"
        "packed = PackedLinear(linear)\n"
        "x = torch.randn(3, 24)\n"
        "close = torch.allclose(packed(x), linear(x), atol=1e-5)\n"
        "warnings.simplefilter('ignore')\n"
        "import omnitts\n"
        "from omnitts.device import features\n"
        "features.cpu_flags = lambda: frozenset({'avx2', 'fma', 'avx512f', 'avx512bw', 'avx512_bf16'})\n"
        f"tts = omnitts.load({str(ckpt_dir('custom_voice'))!r}, dtype='auto')\n"
        "audio = tts.synthesize('Fallback check.', speaker='ryan', greedy=True, max_frames=6)\n"
        "print(json.dumps({'have': have, 'warnings': [str(w.message) for w in caught], 'native': packed.native,\n"
        "                  'close': close, 'dtype': str(tts.ckpt.dtype), 'frames': audio.frames,\n"
        "                  'finite': bool(abs(audio.samples).max() <= 1.0)}))\n"
    )
    run_env = {**_environ_without_native_switch(), "OMNITTS_CACHE_DIR": str(tmp_path), **env}
    done = subprocess.run([sys.executable, "-c", script], env=run_env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["have"] == [False, False] and not got["native"] and got["close"], got
    assert len(got["warnings"]) == len(warned) and all(w in m for w, m in zip(warned, got["warnings"])), got
    assert got["dtype"] == "torch.bfloat16" and got["frames"] > 0 and got["finite"], got
    assert not list(tmp_path.glob("native/*/*.so"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_kernel_matches_the_module(dtype):
    """One row per call or many, one weight or one per head (the fused q/k norm), strided input."""
    if not native.available(dtype):
        pytest.skip(f"no native {dtype} kernel here")
    from omnitts.models.layers import RMSNorm

    torch.manual_seed(4)
    norm = RMSNorm(64, 1e-6).to(dtype)
    for weight, x in ((torch.randn(64), torch.randn(3, 5, 64)),
                      (torch.randn(64), torch.full((1, 1, 64), 3.0)),  # a single, constant row
                      (torch.randn(6, 64), torch.randn(2, 3, 10, 64)[:, :, :6])):  # a split view, as q/k
        norm.weight.data = weight.to(dtype)
        x = x.to(dtype)
        norm.kernel = None
        expected = norm(x)
        norm.kernel = torch.ops.omnitts.rms_norm
        got = norm(x)
        assert got.dtype == dtype and got.shape == x.shape
        # the sum of squares in another order: the scale may differ in its last bit
        tol = 1e-6 if dtype == torch.float32 else 8e-3
        torch.testing.assert_close(got.float(), expected.float(), rtol=tol, atol=tol)


def test_native_norms_reach_every_norm_of_a_loaded_model(ckpt_dir):
    """The loader gives the talker's norms (the fused q/k norms included) the kernel, and the
    model's output stays what the torch norms give."""
    if not native.available(torch.float32):
        pytest.skip("native kernel not built here")
    import omnitts
    from omnitts.models.layers import RMSNorm

    tts = omnitts.load(ckpt_dir("custom_voice"), dtype="float32")
    talker = tts.ckpt.model.talker
    norms = [m for m in talker.modules() if isinstance(m, RMSNorm)]
    assert norms and all(m.kernel is not None for m in norms)
    assert any(m.weight.dim() == 2 for m in norms)  # a fused q/k norm
    x = torch.randn(2, 7, talker.cfg.hidden_size)
    positions = torch.arange(7).expand(2, 7)
    fused = talker.model(x, positions)
    for m in norms:
        m.kernel = None
    torch.testing.assert_close(fused, talker.model(x, positions), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch, new, heads, kv_heads, table_rows", [(8, 1, 16, 8, 8), (1, 7, 16, 8, 1),
                                                                     (3, 2, 2, 1, 3), (3, 2, 2, 1, 1)])
def test_norm_rope_kernel_is_bitwise_the_norm_then_the_rotation(dtype, batch, new, heads, kv_heads, table_rows):
    """The fused q/k norm and rotation equals the norm kernel followed by `apply_rope`, bit for bit: on
    the q and k heads of a fused projection (a strided view), rotary tables per row or shared."""
    if not native.available(dtype):
        pytest.skip(f"no native {dtype} kernel here")
    from omnitts.models.layers import apply_rope, rope_cos_sin

    g = torch.Generator().manual_seed(batch * 10 + new)
    qkv = (torch.randn(batch, new, heads + 2 * kv_heads, 64, generator=g) * 3).to(dtype)
    qk = qkv.split((heads + kv_heads, kv_heads), dim=2)[0]
    weight = torch.randn(heads + kv_heads, 64, generator=g).to(dtype)
    positions = torch.arange(table_rows * new).view(table_rows, new) + 5
    cos, sin = rope_cos_sin(positions, 64, 1e6, dtype)
    expected = apply_rope(torch.ops.omnitts.rms_norm(qk, weight, 1e-6).transpose(1, 2), cos, sin)
    got = torch.ops.omnitts.norm_rope(qk, weight, 1e-6, cos, sin)
    assert got.shape == (batch, heads + kv_heads, new, 64) and got.dtype == dtype
    assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 1, 6144), (3, 5, 6144), (1, 1, 200), (2, 1, 6184), (4, 7, 2000)])
def test_silu_mul_kernel_is_bitwise_torch(dtype, shape):
    """silu(gate) * up over [gate | up] rows equals torch's two kernels bit for bit, row tails (widths
    that are not whole pairs of torch's vectors: its scalar loop) included."""
    if not (native.available(dtype) and torch.ops.omnitts.vectorised_float32()
            and torch.backends.cpu.get_cpu_capability() == "AVX512"):
        pytest.skip("the kernel is used only where torch runs its AVX-512 kernels")
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(shape[-1])) * 4).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    assert torch.equal(torch.ops.omnitts.silu_mul(x), torch.nn.functional.silu(gate) * up)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loaded_talker_takes_the_rope_and_swiglu_kernels_bitwise(ckpt_dir, dtype):
    """The loader gives every fused attention the norm-and-rotate kernel and (where torch runs AVX-512)
    every MLP the silu-product kernel; the talker's output is bitwise what the unfused path gives."""
    torch_dtype = getattr(torch, dtype)
    if not native.available(torch_dtype):
        pytest.skip(f"no native {dtype} kernel here")
    import omnitts
    from omnitts.models.layers import Attention, GatedMLP

    talker = omnitts.load(ckpt_dir("custom_voice"), dtype=dtype).ckpt.model.talker
    attentions = [m for m in talker.modules() if isinstance(m, Attention)]
    mlps = [m for m in talker.modules() if isinstance(m, GatedMLP)]
    assert attentions and all(m.rope_kernel is not None for m in attentions)
    swiglu = torch.ops.omnitts.vectorised_float32() and torch.backends.cpu.get_cpu_capability() == "AVX512"
    assert all((m.kernel is not None) == swiglu for m in mlps)
    x = torch.randn(2, 7, talker.cfg.hidden_size).to(torch_dtype)
    positions = torch.arange(7).expand(2, 7)
    fused = talker.model(x, positions)
    for m in attentions:
        m.rope_kernel = None
    for m in mlps:
        m.kernel = None
    assert torch.equal(fused, talker.model(x, positions))


@needs_f32
@pytest.mark.parametrize("rows, depth", [(1, 80), (3, 80), (8, 80), (33, 80), (1, 81), (5, 81)])
def test_float32_from_bfloat16_storage_is_bitwise_float32_weights(rows, depth):
    """float32 compute over bfloat16-stored weights (kept narrow, in (k, k + 1) pairs, widened as read)
    gives exactly what the same kernel gives over the widened float32 weights: widening is exact, the
    sums the same, in the same order; an odd input size's last k has a zero partner it never uses."""
    torch.manual_seed(rows)
    weight = torch.randn(72, depth).bfloat16()
    bias = torch.randn(72)
    x = torch.randn(rows, depth)
    narrow = torch.ops.omnitts.pack_linear(weight, torch.float32)
    wide = torch.ops.omnitts.pack_linear(weight.float(), torch.float32)
    assert narrow.dtype == torch.bfloat16 and wide.dtype == torch.float32
    got = torch.ops.omnitts.linear(x, narrow, 72, bias)
    assert torch.equal(got, torch.ops.omnitts.linear(x, wide, 72, bias))
    torch.testing.assert_close(got, x @ weight.float().T + bias, rtol=1e-5, atol=1e-5)



@needs_f32
@pytest.mark.parametrize("dtype, stored, depth", [(torch.float32, torch.float32, 40),
                                                  (torch.float32, torch.bfloat16, 41),
                                                  (torch.bfloat16, torch.bfloat16, 40)])
def test_pack_linear_into_given_memory(dtype, stored, depth):
    """pack_linear writes into memory the caller chose (`out`, of `packed_shape`): the very same packed
    weight as its own allocation; a wrong shape or dtype is refused, naming the one it needs."""
    from omnitts.device.cpu_weights import packed_shape

    if not native.available(dtype):
        pytest.skip(f"no native {dtype} kernel here")
    weight = torch.randn(37, depth).to(stored)
    own = torch.ops.omnitts.pack_linear(weight, dtype)
    out = torch.full(packed_shape(37, depth, stored), 7.0, dtype=stored)  # stale values must not survive
    assert torch.ops.omnitts.pack_linear(weight, dtype, out).data_ptr() == out.data_ptr()
    assert own.shape == out.shape and torch.equal(own, out)
    with pytest.raises(RuntimeError, match="out must be a contiguous"):
        torch.ops.omnitts.pack_linear(weight, dtype, torch.empty(own.shape[0], own.shape[1] + 32, dtype=stored))
    with pytest.raises(RuntimeError, match="out must be a contiguous"):
        torch.ops.omnitts.pack_linear(weight, dtype, torch.empty(own.shape, dtype=torch.float16))

def _snake_with_and_without_kernel(dtype, seed):
    """A 12-channel SnakeBeta in `dtype` (each channel its own alpha and beta) and, over contiguous input,
    a time slice (as the tiled decode passes), lengths off the vector width and extreme values,
    (x, torch's result, the kernel's) per input."""
    from omnitts.models.codec import SnakeBeta

    torch.manual_seed(seed)
    snake = SnakeBeta(12).to(dtype).requires_grad_(False)
    snake.alpha.data.normal_(0, 0.5)
    snake.beta.data.normal_(0, 0.5)
    runs = []
    with torch.no_grad():
        for x in (torch.randn(3, 12, 77) * 4, torch.randn(2, 12, 1) * 4, torch.randn(2, 12, 300)[..., 17:233] * 4,
                  torch.tensor([0.0, 1e-30, -2.5, 1e4]).repeat(1, 12, 4)):
            x = x.to(dtype)
            snake.kernel = None
            expected = snake(x)
            snake.kernel = torch.ops.omnitts.snake
            runs.append((x, expected, snake(x)))
    return snake, runs


def test_snake_kernel_is_bitwise_the_bfloat16_module():
    """SnakeBeta in bfloat16: bitwise what torch's operations give (see `_snake_with_and_without_kernel`)."""
    if not native.available(torch.bfloat16):
        pytest.skip("no native bfloat16 kernel here")
    snake, runs = _snake_with_and_without_kernel(torch.bfloat16, 5)
    for x, expected, got in runs:
        assert got.shape == x.shape and got.dtype == torch.bfloat16
        assert torch.equal(got, expected), (got.float() - expected.float()).abs().max()
    with pytest.raises(RuntimeError, match="bfloat16, or float32"):
        torch.ops.omnitts.snake(torch.randn(1, 12, 5).double(), snake.alpha.double(), snake.beta.double())
    with pytest.raises(RuntimeError, match="12 channels"):
        torch.ops.omnitts.snake(torch.randn(1, 12, 5).bfloat16(), snake.alpha[:3], snake.beta)


def test_float32_snake_kernel_is_the_module_to_rounding():
    """SnakeBeta in float32 (AVX-512 builds): SLEEF's 3.5-ulp sine where torch calls MKL's, so the same
    values to a few float32 ulps, large arguments (range reduction) included."""
    if not native.available(torch.float32) or not torch.ops.omnitts.vectorised_float32():
        pytest.skip("no vectorised float32 kernels here")
    snake, runs = _snake_with_and_without_kernel(torch.float32, 6)
    for x, expected, got in runs:
        assert got.shape == x.shape and got.dtype == torch.float32 and got.is_contiguous()
        # sin^2 * inv_beta + x: a few ulps of the sine, scaled by inv_beta (e^0.5-ish), plus x's rounding
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-6)
    with pytest.raises(RuntimeError, match="12 channels"):
        torch.ops.omnitts.snake(torch.randn(1, 12, 5), snake.alpha[:3], snake.beta)


def test_channels_last_snake_is_bitwise_the_float32_kernel():
    """SnakeBeta over channels-last rows (the codec's channels-last residual units) gives, value for value,
    the channels-first float32 kernel's bits: 12 channels (a masked vector), 40 (a whole one and a tail)."""
    if not native.available(torch.float32) or not torch.ops.omnitts.vectorised_float32():
        pytest.skip("no vectorised float32 kernels here")
    for channels in (12, 40):
        g = torch.Generator().manual_seed(channels)
        x = torch.randn(3, channels, 37, generator=g) * 4
        alpha, inv_beta = torch.rand(channels, generator=g) + 0.5, torch.rand(channels, generator=g) + 0.5
        want = torch.ops.omnitts.snake(x, alpha, inv_beta)
        got = torch.ops.omnitts.snake_channels_last(x.transpose(1, 2).contiguous(), alpha, inv_beta)
        assert torch.equal(got.transpose(1, 2), want)
    with pytest.raises(RuntimeError, match="40 channels"):
        torch.ops.omnitts.snake_channels_last(torch.randn(2, 40), alpha[:3], inv_beta)


def test_native_snakes_reach_the_codecs_of_runs_that_are_not_parity_runs(ckpt_dir):
    """The loader gives a bfloat16 codec's SnakeBeta layers the kernel (decode unchanged, bitwise), and a
    float32 codec's too where the language models are not float32 (decode within float32 rounding);
    a float32 run, the parity run, keeps torch's operations."""
    if not native.available(torch.bfloat16):
        pytest.skip("no native bfloat16 kernel here")
    from omnitts.checkpoint import load_checkpoint
    from omnitts.models.codec import SnakeBeta

    f32 = load_checkpoint(ckpt_dir("custom_voice"), dtype="float32")
    assert all(m.kernel is None for m in f32.codec.modules() if isinstance(m, SnakeBeta))
    codes = torch.randint(0, f32.codec.cfg.codebook_size, (2, 16, 6), generator=torch.Generator().manual_seed(0))
    for lm, codec_dtype, exact in (("float32", "bfloat16", True), ("bfloat16", "float32", False)):
        model = load_checkpoint(ckpt_dir("custom_voice"), dtype=lm, codec_dtype=codec_dtype)
        snakes = [m for m in model.codec.modules() if isinstance(m, SnakeBeta)]
        assert snakes and all(m.kernel is not None for m in snakes)
        with torch.no_grad():
            fused = model.codec(codes)
            for m in snakes:
                m.kernel = None
            plain = model.codec(codes)
        if exact:
            assert torch.equal(fused, plain)
        else:
            assert not torch.equal(fused, plain)  # the kernel ran
            # float32 rounding through the decoder: ~1e-5 of the peak (as two chunkings of one decode differ)
            torch.testing.assert_close(fused, plain, rtol=0, atol=1e-4 * plain.abs().max().item())


@pytest.mark.parametrize("m", [2, 3, 4, 5, 6])
def test_winograd_matrices_compute_the_correlation_exactly(m):
    """A^T ((G w) * (B^T x)) is y_i = sum_k w_k x_(i+k) in exact (float64) arithmetic."""
    from omnitts.device.cpu_convs import winograd_matrices, winograd_points

    at, g, bt = winograd_matrices(m, 7, winograd_points(m))
    assert at.shape == (m, m + 6) and g.shape == (m + 6, 7) and bt.shape == (m + 6, m + 6)
    gen = torch.Generator().manual_seed(m)
    for _ in range(5):
        w = torch.randn(7, dtype=torch.float64, generator=gen)
        x = torch.randn(m + 6, dtype=torch.float64, generator=gen)
        want = torch.stack([(w * x[i : i + 7]).sum() for i in range(m)])
        torch.testing.assert_close(at @ ((g @ w) * (bt @ x)), want, rtol=0, atol=1e-12)


def _winograd_cases():
    # (in, out, positions out, dilation, batch): tiles that fill and that overhang the end, one output, T < d
    return [(16, 24, 37, 9, 2), (24, 24, 50, 1, 1), (20, 12, 41, 3, 3), (32, 32, 1, 1, 1), (8, 8, 5, 9, 2),
            (48, 40, 300, 3, 2)]


@needs_f32
@pytest.mark.parametrize("cin,cout,T,d,B", _winograd_cases())
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("m", [3, 4, 5, 6])
def test_winograd_conv_matches_a_float64_convolution(cin, cout, T, d, B, bias, m):
    """F(3, 7) to F(6, 7) (the default) within Winograd's rounding (its transforms scale values by up
    to ~20 and products by up to 32) of the exact result; the direct float32 convolution is ~20-40x
    closer, so this bounds, not mirrors, the direct one."""
    from omnitts.device.cpu_convs import WinogradConv1d

    torch.manual_seed(cin * T + d)
    conv = nn.Conv1d(cin, cout, 7, dilation=d, bias=bias)
    x = torch.randn(B, cin, T + 6 * d)
    with torch.no_grad():
        wino = WinogradConv1d(conv, m=m)
        want = nn.functional.conv1d(x.double(), conv.weight.double(), None if conv.bias is None else conv.bias.double(),
                                    dilation=d)
        got = wino(x)
        assert got.shape == want.shape and got.dtype == torch.float32 and got.is_contiguous()
        assert (got.double() - want).abs().max() < 3e-5 * want.abs().max()
        torch.testing.assert_close(wino(x[:, :, :]).double(), got.double(), rtol=0, atol=0)  # deterministic
        with pytest.raises(ValueError, match="input positions"):
            wino(x[..., : 6 * d])


@needs_f32
@pytest.mark.parametrize("cin,cout,s,T,B", [(12, 20, 4, 9, 2), (16, 8, 3, 1, 1), (8, 8, 2, 30, 3), (24, 16, 5, 7, 1),
                                            (16, 24, 8, 13, 2)])
@pytest.mark.parametrize("bias", [True, False])
def test_winograd_transposed_conv_matches_a_float64_one(cin, cout, s, T, B, bias):
    """F(3, 2) over the polyphase form: full output length (T + 1) * s, block counts that fill the tiles
    and that do not, one input position; its transforms only add and subtract, so it lands as close to
    the exact result as the direct transposed conv (~1e-6 of the peak)."""
    from omnitts.device.cpu_convs import WinogradConvTranspose1d

    torch.manual_seed(cin * T + s)
    conv = nn.ConvTranspose1d(cin, cout, 2 * s, stride=s, bias=bias)
    x = torch.randn(B, cin, T)
    with torch.no_grad():
        wino = WinogradConvTranspose1d(conv)
        want = nn.functional.conv_transpose1d(x.double(), conv.weight.double(),
                                              None if conv.bias is None else conv.bias.double(), stride=s)
        got = wino(x)
        assert got.shape == want.shape == (B, cout, (T + 1) * s) and got.dtype == torch.float32 and got.is_contiguous()
        assert (got.double() - want).abs().max() < 3e-6 * want.abs().max()


@needs_f32
def test_transpose_pad_is_a_padded_transpose_bitwise():
    """(B, R, S) -> (B, before + S + after, R), zero rows around: whole 16 x 16 blocks and ragged edges
    (R and S off 16, S < 16, R < 16), batches, non-contiguous input."""
    torch.manual_seed(9)
    for B, R, S in [(1, 16, 16), (2, 5, 7), (1, 96, 1541), (3, 33, 47), (1, 17, 1), (2, 40, 100), (1, 1, 20)]:
        x = torch.randn(B, R, S)
        for before, after in [(0, 0), (1, 1), (2, 0), (0, 3)]:
            got = torch.ops.omnitts.transpose_pad(x, before, after)
            assert got.is_contiguous()
            assert torch.equal(got, nn.functional.pad(x.transpose(1, 2), (0, 0, before, after)))
    x = torch.randn(2, 30, 50)[:, 3:27, 5:45]
    assert torch.equal(torch.ops.omnitts.transpose_pad(x), x.transpose(1, 2))
    assert torch.ops.omnitts.transpose_pad(torch.randn(2, 4, 0), 1, 1).eq(0).all()
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.omnitts.transpose_pad(torch.randn(1, 4, 4).double())


def test_winograd_kernels_refuse_what_they_do_not_compute():
    if not native.available(torch.float32):
        pytest.skip("native kernel not built here")
    bt = torch.eye(9)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.omnitts.wino_input(torch.randn(1, 30, 4).double(), bt, 3, 1, 8)
    for m, alpha in [(5, 9), (7, 13), (5, 6)]:  # r = 5; F(7, 7); F(5, 2)
        with pytest.raises(RuntimeError, match="F\\(m, r\\) for r = 7 and m = 2 to 6 or r = 2 and m = 2 to 4"):
            torch.ops.omnitts.wino_input(torch.randn(1, 30, 4), torch.eye(alpha), m, 1, 12)
    products = [torch.randn(8, 4) for _ in range(9)]
    with pytest.raises(RuntimeError, match="outputs from"):
        torch.ops.omnitts.wino_output(products, torch.randn(3, 9), None, 1, 1, 8, 25)
    with pytest.raises(RuntimeError, match="9 products wanted"):
        torch.ops.omnitts.wino_output(products[:8], torch.randn(3, 9), None, 1, 1, 8, 24)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        torch.ops.omnitts.wino_output(products[:8] + [torch.randn(7, 4)], torch.randn(3, 9), None, 1, 1, 8, 24)


def test_the_kernels_build_and_compute_without_avx512():
    """The portable paths (an AVX2 build, `OMNITTS_NATIVE_MARCH=haswell`: the float32 linear, Winograd's scalar
    transforms, both forms) compute
    what the modules do; such a build says its float32 transforms are not vectorised, so the loader
    leaves codecs on oneDNN's direct convolution and torch's SnakeBeta there."""
    import subprocess
    import sys
    import textwrap

    if not native.available(torch.float32):
        pytest.skip("native kernel not built here")
    script = textwrap.dedent("""
        import torch
        from torch import nn
        from omnitts.device import native
        assert native.available(torch.float32) and not native.available(torch.bfloat16)
        assert not torch.ops.omnitts.vectorised_float32()
        try:  # no float32 snake in such a build: the loader leaves torch's operations
            torch.ops.omnitts.snake(torch.randn(1, 2, 3), torch.ones(2), torch.ones(2))
            raise AssertionError("a float32 snake without AVX-512")
        except RuntimeError as e:
            assert "bfloat16, or float32" in str(e)
        from omnitts.device.cpu_convs import WinogradConv1d, WinogradConvTranspose1d
        from omnitts.device.cpu_weights import PackedLinear
        torch.manual_seed(0)
        linear = nn.Linear(40, 50)
        x = torch.randn(3, 40)
        with torch.no_grad():
            packed = PackedLinear(linear)
            assert packed.native
            torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
            for cin, cout, T, d, B in [(16, 24, 37, 9, 2), (24, 24, 50, 1, 1), (20, 12, 41, 3, 3)]:
                conv = nn.Conv1d(cin, cout, 7, dilation=d)
                x = torch.randn(B, cin, T + 6 * d)
                want = nn.functional.conv1d(x.double(), conv.weight.double(), conv.bias.double(), dilation=d)
                got = WinogradConv1d(conv)(x).double()
                assert got.shape == want.shape and (got - want).abs().max() < 3e-5 * want.abs().max()
            conv = nn.ConvTranspose1d(12, 20, 8, stride=4)
            x = torch.randn(2, 12, 9)
            want = nn.functional.conv_transpose1d(x.double(), conv.weight.double(), conv.bias.double(), stride=4)
            got = WinogradConvTranspose1d(conv)(x).double()
            assert got.shape == want.shape and (got - want).abs().max() < 3e-6 * want.abs().max()
        print("ok")
    """)
    # The user's cache, not a fresh one: the build (~10 s quiet, 40 s busy) happens once per machine and source.
    env = {**_environ_without_native_switch(), "OMNITTS_NATIVE_MARCH": "haswell"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
