"""Streaming codec decode (`CodecStreams`) against the whole-utterance reference decode (`decode_codes`).

Tolerance: the stream carries every piece of state exactly, but PyTorch's CPU kernels pick their
algorithm (and float summation order) from the call's shape — convs switch between oneDNN and
im2col+GEMM by input size and batch, GEMMs differ for few columns, SDPA's GEMM blocks depend on the
window length — so a chunk of 25 frames can round differently from a 300-frame window in the last
bits (~2e-6 here). Wrong state shows up as errors of order 1e-2 (the tiny codec's amplitude is ~0.1).
Single streams whose windows stay under 192 frames are bitwise equal on CPU; one test pins that.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnitts.checkpoint import load_checkpoint
from omnitts.engine.reference import decode_codes
from omnitts.models.codec_stream import StreamingCodec
from omnitts.models.codec_streams import HOLD, CodecStreams

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

ATOL = 1e-5


@pytest.fixture(scope="module")
def ckpt(ckpt_dir):
    return load_checkpoint(ckpt_dir("base"), dtype="float32")


def _codes(n: int, seed: int):
    if n == 0:
        return None
    return torch.randint(0, 2048, (n, 16), generator=torch.Generator().manual_seed(seed))


def _stream(streams: CodecStreams, codes, ref=None, feed: int = 7) -> np.ndarray:
    sid = streams.open(ref)
    pieces = []
    for i in range(0, len(codes), feed):
        streams.push(sid, codes[i:i + feed])
        pieces += list(streams.pump().values())
    end = streams.close(sid)
    return np.concatenate([end.head, *pieces, end.tail])


def _check(ckpt, got: np.ndarray, codes, ref=None) -> float:
    want = decode_codes(ckpt, codes, ref)
    assert got.dtype == np.float32 and got.shape == want.shape
    delta = float(np.abs(got - want).max())
    assert delta <= ATOL, delta
    return delta


@pytest.mark.parametrize("frames", [1, 10, 25, 50, 53, 330, 620])
def test_stream_equals_whole_decode(ckpt, frames):
    codes = _codes(frames, frames)
    _check(ckpt, _stream(CodecStreams(ckpt.codec, max_streams=2), codes), codes)


@pytest.mark.parametrize("frames,ref_frames", [(1, 0), (10, 0), (53, 0), (150, 0), (6, 17), (40, 30)])
def test_single_short_stream_is_bitwise_equal(ckpt, frames, ref_frames):
    """Windows < 192 frames, one stream, one thread: the kernels see the reference's shapes, so no
    rounding differs on the CPUs this was written on (Intel, AVX-512). On an AMD EPYC (Zen 4) with the
    same torch the conv kernels still round differently by a few 1e-7 (the commit before any of this
    change shows it too), so the bound is the float32 rounding of this signal, not zero."""
    ref, codes = _codes(ref_frames, 100 + ref_frames), _codes(frames, frames)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = _stream(CodecStreams(ckpt.codec, max_streams=1), codes, ref)
        whole = decode_codes(ckpt, codes, ref)
    finally:
        torch.set_num_threads(threads)
    assert got.shape == whole.shape
    assert np.abs(got - whole).max() <= 2e-6  # measured up to 7.4e-7 here; 16-bit output steps by 3e-5


@pytest.mark.parametrize("chunk", [16, 40])
def test_chunk_sizes_not_dividing_the_window(ckpt, chunk):
    codes = _codes(340, 7)
    _check(ckpt, _stream(CodecStreams(ckpt.codec, chunk_frames=chunk, max_streams=1), codes, feed=11), codes)


# (reference frames, generated frames): (13, 10), (17, 6) and (15, 7) make int(ref / total * len) round
# down to ref * 1920 - 1; 300 and 310 reference frames start decoding at a later official window.
@pytest.mark.parametrize("ref_frames,frames", [(13, 10), (17, 6), (15, 7), (30, 40), (300, 30), (310, 12)])
def test_icl_reference_cut(ckpt, ref_frames, frames):
    ref, codes = _codes(ref_frames, 100 + ref_frames), _codes(frames, frames)
    total = ref_frames + frames
    rounds_down = int(ref_frames / total * (total * 1920)) < ref_frames * 1920
    assert rounds_down == ((ref_frames, frames) in [(13, 10), (17, 6), (15, 7)])
    _check(ckpt, _stream(CodecStreams(ckpt.codec, max_streams=1), codes, ref), codes, ref)


def test_icl_without_generated_frames_is_empty(ckpt):
    streams = CodecStreams(ckpt.codec, max_streams=1)
    sid = streams.open(_codes(20, 1))
    assert sum(len(w) for w in streams.pump().values()) == 0
    end = streams.close(sid)
    assert len(end.head) == len(end.tail) == 0


def test_streams_at_different_phases_batch_together(ckpt):
    """Several streams, pushed at different rates and started at different times, share pump calls."""
    specs = [(330, 0, 5, 0), (64, 0, 25, 3), (620, 0, 13, 1), (40, 30, 3, 0), (100, 301, 50, 6)]
    data = [(_codes(n, n), _codes(r, r + 1), feed, delay) for n, r, feed, delay in specs]
    streams = CodecStreams(ckpt.codec, max_streams=8)
    batch_sizes = []
    step_fn = streams.codec.step

    def counting_step(codes, *args):
        batch_sizes.append(codes.shape[0])
        return step_fn(codes, *args)

    streams.codec.step = counting_step
    audio = _phased(streams, data)
    assert max(batch_sizes) >= 3  # rows at different window positions really shared calls
    for (codes, ref, _, _), got in zip(data, audio):
        alone = _stream(CodecStreams(ckpt.codec, max_streams=1), codes, ref)
        assert np.abs(got - alone).max() <= ATOL
        _check(ckpt, got, codes, ref)


@pytest.mark.parametrize("frames,feed", [(40, 7), (53, 53), (340, 11)])
def test_streams_decode_no_dummy_frames(ckpt, frames, feed):
    """Every frame the decoder runs is a real one: the pushed frames, plus the 25 context frames the
    official decode re-reads at its 300-frame window boundary. (A window's last call used to be
    padded to whole chunks: 40 frames cost 50.)"""
    streams = CodecStreams(ckpt.codec, max_streams=1)
    step_fn, decoded = streams.codec.step, []

    def counting_step(codes, *args):
        decoded.append(codes.shape[0] * codes.shape[2])
        return step_fn(codes, *args)

    streams.codec.step = counting_step
    codes = _codes(frames, frames)
    _check(ckpt, _stream(streams, codes, feed=feed), codes)
    assert sum(decoded) == frames + (streams.left_context if frames > streams.window_frames else 0)


def test_state_does_not_grow_with_length(ckpt):
    streams = CodecStreams(ckpt.codec, max_streams=2)
    shapes = {k: tuple(v.shape) for k, v in streams.state.items()}
    sid = streams.open()
    codes = _codes(900, 3)
    for i in range(0, 900, 25):
        streams.push(sid, codes[i:i + 25])
        streams.pump()
        s = streams.streams[sid]
        assert len(s.feed) <= streams.chunk + HOLD and len(s.history) <= streams.left_context
        assert {k: tuple(v.shape) for k, v in streams.state.items()} == shapes
    # One step's state has exactly the shapes of a fresh state (O(receptive field), not O(frames)).
    codec = StreamingCodec(ckpt.codec)
    fresh = codec.new_state(3)
    _, after = codec.step(torch.zeros(3, 16, 25, dtype=torch.long), fresh, [0, 100, 200], [0, 16, 128],
                          [32, 112, 112])
    assert {k: v.shape for k, v in after.items()} == {k: v.shape for k, v in fresh.items()}
    streams.close(sid)
    assert len(streams.free) == 2


@pytest.mark.parametrize("rows", [1, 3])
def test_time_slices_equal_one_pass(ckpt, rows):
    """The late decoder layers run in time slices (`tile_frames`); slicing carries state exactly."""
    codes = torch.randint(0, 2048, (rows, 16, 25), generator=torch.Generator().manual_seed(rows))
    start, base, kv_len = [0] * rows, [0] * rows, [25] * rows
    outs = {}
    for tile in (1, 8, 16, None):  # one frame per slice, 8, the CPU default, one slice (devices)
        codec = StreamingCodec(ckpt.codec, tile_frames=tile)
        state = codec.new_state(rows)
        wav1, state = codec.step(codes[..., :12], state, start, base, [12] * rows)
        wav2, state = codec.step(codes[..., 12:], state, [12] * rows, base, kv_len)
        outs[tile] = torch.cat([wav1, wav2], -1), state
    wav, state = outs[None]
    assert wav.shape == (rows, 1, 25 * ckpt.codec.cfg.samples_per_frame)
    for tile in (1, 8, 16):
        assert (outs[tile][0] - wav).abs().max() <= 2e-6  # float rounding only; lost state is ~1e-2
        for name, tensor in state.items():
            # Inner activations (up to ~3 here) carry the same rounding, amplified by the random
            # codec's SnakeBeta slopes (measured up to 9e-5); a wrong or lost state is off by O(0.1).
            torch.testing.assert_close(outs[tile][1][name], tensor, rtol=1e-3, atol=1e-3)


def _snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    """Signal-to-error ratio in dB; infinite when `other` is `reference` bitwise."""
    error = np.sum((reference - other) ** 2)
    return float("inf") if error == 0 else float(10 * np.log10(np.sum(reference ** 2) / error))


def _torch_kernels_below_the_cpu() -> bool:
    """torch's kernels limited below AVX-512 (CI's emulated AVX2 profile) on a CPU with AMX: torch's bfloat16
    CPU flash attention then picks its AMX path by the hardware and refuses it by the limit ("pack_vnni2 is
    only supported when avx512 is supported", torch 2.4 to 2.13). A real AVX2-only CPU has no AMX path."""
    import os

    from omnitts.device.features import _detected_flags  # the hardware's, not the profile's view of it

    return os.environ.get("ATEN_CPU_CAPABILITY") in ("avx2", "default") and "amx_bf16" in _detected_flags()


@pytest.mark.skipif(_torch_kernels_below_the_cpu(), reason="torch's bfloat16 CPU attention fails when AVX2 is "
                                                             "emulated on an AMX CPU")
@pytest.mark.parametrize("frames,ref_frames", [(330, 0), (40, 30)])
def test_bfloat16_codec_streams_like_its_whole_decode(ckpt, ckpt_dir, frames, ref_frames):
    """A bfloat16 codec (`codec_dtype`) keeps its stream state in bfloat16 and answers float32 audio. The
    stream cannot be bitwise equal to the whole decode there (chunk-shaped kernels round differently, and
    bfloat16 keeps 8 bits), but it follows it closely (measured 46-48 dB on the tiny codec; a state
    carried wrongly is near 0 dB), across a window reset and an ICL cut; against the float32 decode it
    keeps the codec's bfloat16 cost (17 dB on the tiny codec)."""
    half = load_checkpoint(ckpt_dir("base"), codec_dtype="bfloat16")
    streams = CodecStreams(half.codec, max_streams=2)
    assert {t.dtype for t in streams.state.values()} == {torch.bfloat16}
    codes, ref = _codes(frames, frames), _codes(ref_frames, 1)
    got = _stream(streams, codes, ref)
    whole, full = decode_codes(half, codes, ref), decode_codes(ckpt, codes, ref)
    assert got.dtype == np.float32 and got.shape == whole.shape == full.shape
    assert _snr_db(whole, got) > 35 and 12 < _snr_db(full, got) < 40


def test_channels_last_units_stream_like_their_whole_decode(ckpt_dir):
    """A codec whose residual units run channels-last (Winograd convs, the channel limit lowered: a
    bfloat16 model's float32 codec) keeps their causal state channels-last: streams at different rates,
    batched together, decode what the whole decode of the same codec gives, within Winograd's rounding
    (the tile grid follows the call)."""
    from omnitts.device import cpu_convs, native
    from omnitts.models.codec import ResidualUnit

    if not native.available(torch.float32) or not torch.ops.omnitts.vectorised_float32():
        pytest.skip("the native kernels do not build here with AVX-512")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_convs, "WINOGRAD_MIN_CHANNELS", 1)
        ckpt = load_checkpoint(ckpt_dir("base"), dtype="bfloat16")
    units = [m for m in ckpt.codec.modules() if isinstance(m, ResidualUnit)]
    assert units and all(m.channels_last is not None for m in units)
    streams = CodecStreams(ckpt.codec, max_streams=4)
    unit = units[0]
    assert streams.state[streams.codec.names[unit.conv1]].shape[1:] == (unit.conv1.span - 1, unit.conv1.conv.in_channels)
    data = [(_codes(n, n), feed) for n, feed in ((53, 7), (90, 25), (31, 4))]
    sids = [streams.open(None) for _ in data]
    outs = [[] for _ in data]
    for step in range(max(-(-len(c) // f) for c, f in data) + 1):
        for sid, (codes, feed) in zip(sids, data):
            if step * feed < len(codes):
                streams.push(sid, codes[step * feed:(step + 1) * feed])
            else:
                streams.finish(sid)
        got = streams.pump()
        for sid, out in zip(sids, outs):
            if sid in got:
                out.append(got[sid])
    for sid, out, (codes, _) in zip(sids, outs, data):
        end = streams.close(sid)
        got = np.concatenate([end.head, *out, end.tail])
        want = decode_codes(ckpt, codes)
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-4


def test_snake_coefficients_are_made_once_and_follow_the_parameters():
    """SnakeBeta keeps exp(alpha) and 1 / (exp(beta) + 1e-9) between calls (fewer small kernels per codec
    step), made again when a parameter changes in place or is replaced (a load, `.to`)."""
    from omnitts.models.codec import SnakeBeta

    snake = SnakeBeta(6)
    with torch.no_grad():
        snake.alpha.copy_(torch.linspace(-1, 1, 6))
    first = snake.coefficients()
    assert all(a is b for a, b in zip(first, snake.coefficients()))
    x = torch.randn(2, 6, 5)
    inv_beta = 1 / (snake.beta.exp() + 1e-9)
    want = x + inv_beta[None, :, None] * torch.sin(x * snake.alpha.exp()[None, :, None]) ** 2
    torch.testing.assert_close(snake(x), want)
    with torch.no_grad():
        snake.beta.add_(0.5)
    alpha, inv_beta = snake.coefficients()
    assert torch.equal(inv_beta, 1.0 / (snake.beta.exp() + 1e-9)) and not torch.equal(inv_beta, first[1])
    snake.to(torch.float64)
    assert snake.coefficients()[0].dtype == torch.float64


def _staggered(ckpt, gather: int, lengths, starts):
    """Streams that start at different pumps and get one frame a pump, as a running batch makes them;
    returns each stream's samples and the codec calls made."""
    from omnitts.models import codec_stream

    calls = []
    step = codec_stream.StreamingCodec.step

    def counted(self, codes, *args, **kwargs):
        calls.append(codes.shape[0])
        return step(self, codes, *args, **kwargs)

    streams = CodecStreams(ckpt.codec, max_streams=len(lengths), gather=gather)
    codes = [_codes(n, 100 + i) for i, n in enumerate(lengths)]
    sids, pieces, ends = {}, {i: [] for i in range(len(lengths))}, {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(codec_stream.StreamingCodec, "step", counted)
        for t in range(max(s + n for s, n in zip(starts, lengths)) + 1):
            for i, (start, n) in enumerate(zip(starts, lengths)):
                if t == start:
                    sids[i] = streams.open(None)
                if i in sids and i not in ends and start <= t < start + n:
                    streams.push(sids[i], codes[i][t - start:t - start + 1])
            for sid, samples in streams.pump().items():
                pieces[next(i for i, s in sids.items() if s == sid)].append(samples)
            for i, (start, n) in enumerate(zip(starts, lengths)):
                if t == start + n - 1:
                    ends[i] = streams.close(sids[i])
    audio = [np.concatenate([ends[i].head, *pieces[i], ends[i].tail]) for i in range(len(lengths))]
    return audio, calls, codes


def test_gathered_chunks_share_calls_and_decode_the_same(ckpt):
    """`gather` (accelerators): a ready chunk waits for other streams, so staggered streams share fewer,
    fuller calls, and the audio is what each stream decodes alone (window ends and finished streams run
    at once)."""
    lengths, starts = [120, 95, 140, 80, 110, 130], [0, 3, 7, 11, 16, 20]
    plain, plain_calls, codes = _staggered(ckpt, 0, lengths, starts)
    gathered, gathered_calls, _ = _staggered(ckpt, 12, lengths, starts)
    assert len(gathered_calls) < len(plain_calls) and max(gathered_calls) > max(plain_calls)
    assert sum(gathered_calls) <= sum(plain_calls)  # rows decoded: no chunk twice
    for got, alone, c in zip(gathered, plain, codes):
        assert got.shape == alone.shape
        assert float(np.abs(got - alone).max()) <= ATOL
        _check(ckpt, got, c)


def _phased(streams: CodecStreams, data) -> list[np.ndarray]:
    """`data` [(codes, ref, feed, delay)]: streams opened `delay` pumps in, fed `feed` frames per pump,
    finished and closed when fed; each stream's audio (head + pumped + tail)."""
    sids, outs, fed, ends, step = {}, {}, {}, {}, 0
    while len(ends) < len(data):
        for i, (codes, ref, feed, delay) in enumerate(data):
            if step == delay:
                sids[i], outs[i], fed[i] = streams.open(ref), [], 0
            if i not in sids or i in ends:
                continue
            if fed[i] < len(codes):
                streams.push(sids[i], codes[fed[i]:fed[i] + feed])
                fed[i] += feed
            else:
                streams.finish(sids[i])
        got = streams.pump()
        for i, sid in sids.items():
            if i not in ends:
                outs[i].append(got.get(sid, np.zeros(0, np.float32)))
                s = streams.streams[sid]
                if s.finished and len(s.feed) == 0:
                    ends[i] = streams.close(sid)
        step += 1
    return [np.concatenate([ends[i].head, *outs[i], ends[i].tail]) for i in range(len(data))]


def test_fixed_shape_calls_decode_like_the_whole_decode_eager_and_in_fake_graphs(ckpt):
    """Accelerators (`fixed`): calls of a few shapes only (rows padded to a bucket on the spare slot, a window's
    last frames padded to chunk + HOLD - 1), captured once per shape under the fake's graph rules and replayed;
    the audio is the whole decode's (ICL, window boundaries, streams joining and leaving at any phase), and
    the graphs' is the eager fixed calls' to the bit."""
    from omnitts.device.fake import FakeGraphBackend

    specs = [(330, 0, 5, 0), (64, 0, 25, 3), (7, 0, 7, 1), (40, 30, 3, 0), (100, 301, 50, 6), (26, 0, 2, 2)]
    data = [(_codes(n, n), _codes(r, r + 1), feed, delay) for n, r, feed, delay in specs]
    eager = CodecStreams(ckpt.codec, max_streams=6, fixed=True, gather=3)
    backend = FakeGraphBackend()
    graphed = CodecStreams(ckpt.codec, max_streams=6, fixed=True, gather=3, graphs=backend.call_graphs())
    plain_audio, graphed_audio = _phased(eager, data), _phased(graphed, data)
    assert eager.row_buckets == [1, 2, 4, 6]
    for streams in (eager, graphed):
        assert streams.calls and {frames for _, frames in streams.calls} <= {25, 25 + HOLD - 1}
        assert {rows for rows, _ in streams.calls} <= {1, 2, 4, 6}
    assert len(streams.calls) >= 3  # several shapes really ran
    assert all(call.graph is None for call in eager.calls.values())
    graphs = [call.graph for call in graphed.calls.values()]
    assert len(backend.captured) == len(graphs) == graphed.graphs.captures and all(g.replays for g in graphs)
    for (codes, ref, _, _), got, plain in zip(data, graphed_audio, plain_audio):
        np.testing.assert_array_equal(got, plain)
        _check(ckpt, got, codes, ref)
    assert not graphed.streams and sorted(graphed.free) == list(range(6))


def test_a_refused_codec_capture_runs_its_calls_eagerly_with_one_warning(ckpt):
    """A device that refuses to capture a codec call: one warning, that call and every later one eager, the
    same audio; the CPU fake (capture_fallback off) raises instead."""
    from omnitts.device.fake import FakeGraphBackend

    class Refusing(FakeGraphBackend):
        capture_fallback = True

        def new_graph(self, *args):
            raise RuntimeError("operation not permitted when stream is capturing")

    codes = _codes(70, 3)
    want = _stream(CodecStreams(ckpt.codec, max_streams=2, fixed=True), codes)
    graphs = Refusing().call_graphs()
    with pytest.warns(RuntimeWarning, match="codec call failed"):
        got = _stream(CodecStreams(ckpt.codec, max_streams=2, fixed=True, graphs=graphs), codes)
    np.testing.assert_array_equal(got, want)
    assert graphs.refused and graphs.captures == 0

    class Raising(Refusing):
        capture_fallback = False

    with pytest.raises(RuntimeError, match="not permitted"):
        _stream(CodecStreams(ckpt.codec, max_streams=2, fixed=True, graphs=Raising().call_graphs()), codes)


def test_the_codec_state_is_only_touched_on_the_codec_calls_own_stream(ckpt):
    """With graphs on a stream of their own (accelerators), every device op that reads or writes the streams'
    state (a call, a new stream's reset, a window boundary's reset) runs inside `on_stream()`: one stream
    orders them, so no reset can overtake a call still in flight (or the reverse)."""
    import contextlib
    import types

    from torch.utils._python_dispatch import TorchDispatchMode

    from omnitts.device.fake import FakeGraphBackend

    inside = []

    class Tracking(FakeGraphBackend):
        def __init__(self):
            super().__init__()
            api = self._api

            @contextlib.contextmanager
            def stream(s):
                inside.append(s)
                try:
                    yield
                finally:
                    inside.pop()
            self._api = types.SimpleNamespace(**{**vars(api), "stream": stream})

    streams = CodecStreams(ckpt.codec, max_streams=4, fixed=True, graphs=Tracking().call_graphs())
    assert streams.graphs.stream is not None
    storages = {t.untyped_storage().data_ptr() for t in streams.state.values()}
    outside = []

    class Check(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            touched = [a for a in torch.utils._pytree.tree_leaves((args, kwargs or {}))
                       if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in storages]
            if touched and not inside:
                outside.append(str(func))
            return func(*args, **(kwargs or {}))

    data = [(_codes(n, n), _codes(r, r + 1), feed, delay) for n, r, feed, delay in
            [(330, 0, 9, 0), (40, 30, 3, 0), (26, 0, 2, 2), (60, 0, 20, 5)]]
    with Check():
        audio = _phased(streams, data)
        sid = streams.open(None)  # a stream abandoned mid-way; its slot is reset when handed out again
        streams.push(sid, _codes(50, 9))
        streams.pump()
        streams.discard(sid)
        streams.open(None)
    assert not outside, outside
    for (codes, ref, _, _), got in zip(data, audio):
        _check(ckpt, got, codes, ref)
