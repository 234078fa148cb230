"""Host-side manager of many codec streams: frames in (as generation produces them), audio out, batched.

`CodecStreams` reproduces `reference.decode_codes` (the official whole-utterance decode) while streaming:

- the official decode runs windows of `window_frames` (300) frames of the full (ref + generated)
  sequence, each re-decoding `left_context` (25) frames from scratch. A stream does the same: at each
  window boundary its state rows are zeroed and the last 25 frames are fed again (output discarded);
- attention rounding depends on the window's final length T (the CPU kernel sums the last T mod 8
  keys in a scalar tail), so a chunk is decoded only when T is known or at least `HOLD` more frames
  exist, and the call that ends a window spans exactly its keys (<= 15 frames of extra latency);
  on the CPU calls are never padded: a window that fits in one call runs in the reference's own call
  shape (accelerators pad them to a few fixed shapes, `fixed`, for their graphs);
- ICL: decoding starts at the window holding the last reference frame; the reference's cut
  `int(ref / total * len)` is `ref * 1920` or one sample less, known only at the end, so the last
  reference sample is held back and returned by `close` as `head` (it precedes everything `pump` gave).

Streams occupy slots of one state pool; `pump` gathers the rows of all ready streams, runs ONE
`StreamingCodec.step` per call size (rows at any window position batch together) and scatters the
state back. A call that raises changes nothing (state and streams are written back only after it
returns), so its rows are tried again one by one: a stream that fails alone is set aside in `broken`
(its owner discards it) and the others go on. Rows of a call take the same number of frames: `chunk_frames`, or a window's last few
(those run with the rows of the same length, or alone). Memory per stream is fixed by its slot.
See `codec_stream.py` for how close to bitwise the result is.

Copies: a call's slots, frames and positions go to the device in pinned, non_blocking uploads, and its
waveform comes back through `to_host` (the device backend's deferred copy), read only when asked:
`pump_later` hands out `Samples` whose `result()` waits, so the engine's next frame can be queued
before the host waits for this decode (`pump` reads them at once; `close` too, once per stream).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from .codec import CodecDecoder
from .codec_stream import KV_ALIGN, TILE_FRAMES, StreamingCodec, next_base, round_up

HOLD = KV_ALIGN - 1  # frames that must follow a chunk whose window length is not yet known
# Rows of the largest fixed-shape call (`fixed`): more ready streams take several calls. On an H200 a 0.6B
# codec call of 32 rows x 39 frames holds ~1 GB per activation of its last layers (96 channels x 1920 samples
# per frame, float32); every shape's graph keeps its activations.
MAX_FIXED_ROWS = 32
# The share of the device's free memory the streams' state may take (`free_memory`): the engine's K/V
# cache, the calls' activations and the graphs come after it.
FREE_SHARE = 0.5


@dataclass
class StreamEnd:
    """What `close` returns: `head` (0 or 1 samples) goes BEFORE all pumped audio, `tail` after it."""

    head: np.ndarray
    tail: np.ndarray


class _HostCopy:
    """One call's waveform on its way to the host: waited for once, by the first `Samples` that reads it."""

    def __init__(self, transfer):
        self.transfer, self.array = transfer, None
        self.kept: list[_Kept] = []  # single samples to copy out when the waveform arrives

    def result(self) -> np.ndarray:
        if self.array is None:
            self.array, self.transfer = self.transfer.result(), None
            for sample in self.kept:
                sample.take(self.array)
            self.kept = []
        return self.array


class _Kept:
    """One sample a stream keeps past its call (the ICL lead, needed at `close`): copied out as soon as
    the call's waveform is read, so the stream does not hold on to the whole batch's waveform."""

    def __init__(self, copy: _HostCopy, row: int, at: int):
        self.copy, self.row, self.at, self.value = copy, row, at, None
        copy.kept.append(self)

    def take(self, array: np.ndarray) -> None:
        self.value, self.copy = array[self.row, self.at:self.at + 1].copy(), None

    def result(self) -> np.ndarray:
        if self.value is None:
            self.copy.result()  # calls `take`
        return self.value


class Samples:
    """A stream's new samples, possibly still on their way from the device: slices (copy, row, lo, hi)
    of calls' waveforms, in order. `len` is known at once; `result()` waits for the copies."""

    def __init__(self, parts: list):
        self.parts = parts

    def __len__(self) -> int:
        return sum(hi - lo for _, _, lo, hi in self.parts)

    def result(self) -> np.ndarray:
        pieces = [copy.result()[row, lo:hi] for copy, row, lo, hi in self.parts]
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


class _Now:
    """A device-to-host copy made at once (the default `to_host`: fine on the CPU, a wait elsewhere). A copy
    on the CPU too: a fixed-shape call's output buffer is rewritten by the next call of its shape."""

    def __init__(self, tensor: torch.Tensor):
        self.array = tensor.detach().cpu().numpy().copy()

    def result(self) -> np.ndarray:
        return self.array


@dataclass
class _Stream:
    slot: int
    feed: np.ndarray  # (m, 16) frames still to run through the decoder (context frames included)
    history: np.ndarray  # (<= left_context, 16) last frames fed, to re-prime after a window boundary
    window_len: int  # frames of the current window, context included
    pos: int = 0  # window position of the next fed frame
    base: int = 0  # window position of K/V slot 0
    drop: int = 0  # samples still to discard (context frames, reference frames)
    ref_frames: int = 0
    generated: int = 0
    lead: _Kept | None = None  # the last reference sample (ICL), once decoded
    finished: bool = False
    waited: int = 0  # pumps its ready chunk has been held back for other streams (`gather`)


class CodecStreams:
    """Streaming, batched codec decode for many requests, equal to the whole-utterance decode.

    `sid = streams.open(ref_codes)`; `streams.push(sid, frames)`; `streams.pump() -> {sid: samples}`;
    `streams.finish(sid)` (no more frames; the next pump flushes it with the others);
    `streams.close(sid) -> StreamEnd` (flushes what is left alone, frees the slot). For every stream,
    head + all pumped samples + tail == `decode_codes(ckpt, codes, ref_codes)` (up to float rounding,
    see `codec_stream.py`). `head` exists because the ICL cut is only known at the end; it is empty
    without reference codes and whenever `int(ref / total * len)` does not round down.
    """

    def __init__(self, codec: CodecDecoder, chunk_frames: int = 25, max_streams: int = 16,
                 window_frames: int = 300, left_context: int = 25, tile_frames: int | None = TILE_FRAMES,
                 upload=None, to_host=None, gather: int = 0, fixed: bool = False, graphs=None,
                 max_rows: int | None = None, free_memory: int | None = None):
        """`tile_frames`: see `StreamingCodec` (the device backend's `codec_tile_frames`); `upload(host
        tensor) -> device tensor` and `to_host(device tensor) -> handle with result()`: the device layer's
        copies (`device.copies.uploader`, `Backend.to_host`); the defaults copy plainly, at once.

        `gather` (the backend's `codec_gather`; 0: off): pumps a stream's ready mid-window chunk may be
        held back so that more streams share its call, until half the live streams are ready or one has
        waited that long. Where a call's cost is mostly fixed (a GPU: launches and host work per call,
        whatever its rows), fewer, fuller calls win; and streams decoded together stay in step, so their
        next chunks are ready together. Window ends and finished streams are never held; the samples
        do not change (a chunk's frames and its place in the window stay the same; only its batch mates do).

        `max_rows`: rows per call at most (1 in deterministic mode: each stream alone, its samples
        independent of the others'). `fixed` (the backend's `codec_fixed_shapes`: accelerators): every call
        has one of a few shapes, the rows padded to a bucket (1, 2, 4, ... `max_rows`; padding rows compute
        on a spare state slot) and a window's last frames padded to `chunk_frames + HOLD - 1` (the codec is
        causal: frames after a row's last real one change none of its samples, and its state is dropped
        after a window's end). That is what a device graph needs, and on a GPU it keeps cuDNN's and
        attention's per-shape plans few.
        `graphs` (`device.base.CallGraphs`, or None: eager): captures each shape's call once and replays it.
        `free_memory` (bytes, the backend's `free_memory()`; None: unknown): state that would take more than
        FREE_SHARE of it raises MemoryError instead of being allocated (a CPU would swap, or the out-of-memory
        killer end the process without a word).
        Not bitwise the unpadded decode (other call shapes round differently), within float rounding of it."""
        assert 0 < left_context <= window_frames
        self.fixed, self.graphs = fixed, graphs
        self.final_frames = chunk_frames + HOLD - 1 if fixed else 0  # a window's last call, padded to this
        # Rows per call at most (None: all ready rows of a shape; `fixed`: MAX_FIXED_ROWS). 1: every stream
        # decodes alone, so its samples never depend on who else is decoding (deterministic mode).
        self.max_rows = max_rows or (MAX_FIXED_ROWS if fixed else None)
        self.row_buckets = _row_buckets(min(self.max_rows, max_streams)) if fixed else []
        # RoPE positions stay below the window length (context included) plus a padded call's extra frames.
        self.codec = StreamingCodec(codec, window_frames + left_context + self.final_frames, tile_frames, upload)
        self.to_host = to_host or _Now
        self.chunk, self.window_frames, self.left_context = chunk_frames, window_frames, left_context
        self.gather = gather
        self.spf = self.codec.samples_per_frame
        # fixed: one more slot, the padding rows' (never handed out)
        slots = max_streams + 1 if fixed else max_streams
        need = self.codec.state_bytes(slots)
        if free_memory is not None and need > FREE_SHARE * free_memory:  # refused, not left to the OOM killer
            raise MemoryError(f"{need / 1e9:.1f} GB of state, {need / slots / 1e6:.1f} MB a stream, against "
                              f"{free_memory / 1e9:.1f} GB free")
        self.state = self.codec.new_state(slots)
        self.spare = max_streams
        self.calls: dict[tuple[int, int], _Call] = {}  # (rows, frames) -> its buffers and graph (fixed)
        self.free = list(range(max_streams))[::-1]
        self.streams: dict[int, _Stream] = {}
        self.broken: dict[int, Exception] = {}  # sid -> what its decode raised (pump skips it; see `discard`)
        self._next_id = 0

    # -- lifecycle ---------------------------------------------------------------------------------------

    def open(self, ref_codes=None) -> int:
        """Start a stream; `ref_codes` (R, 16) are the ICL reference frames decoded in front (then cut)."""
        if not self.free:
            raise RuntimeError(f"all {self.spare} codec stream slots are in use; close one first")
        slot = self.free.pop()
        with self._on_stream():
            for t in self.state.values():
                t[slot] = 0
        ref = _frames(ref_codes)
        r = len(ref)
        # Start at the official window holding the last reference frame (earlier windows cannot matter).
        first = (r - 1) // self.window_frames * self.window_frames if r else 0
        context = min(self.left_context, first)
        s = _Stream(slot, ref[first - context:], ref[max(0, first - context - self.left_context):first - context],
                    window_len=context + self.window_frames, ref_frames=r)
        s.drop = max(0, (r - first + context) * self.spf - 1) if r else 0
        sid, self._next_id = self._next_id, self._next_id + 1
        self.streams[sid] = s
        return sid

    def push(self, sid: int, codes) -> None:
        """Append generated frames (n, 16) (numpy or tensor) to stream `sid`."""
        s = self.streams[sid]
        assert not s.finished, f"stream {sid} is finished"
        frames = _frames(codes)
        s.feed = np.concatenate([s.feed, frames])
        s.generated += len(frames)

    def finish(self, sid: int) -> None:
        """No more frames for `sid`: the next `pump` decodes the rest (with the other streams)."""
        self.streams[sid].finished = True

    def close(self, sid: int) -> StreamEnd:
        """Finish `sid`, decode whatever is left, apply the ICL cut and free the slot."""
        s = self.streams[sid]
        s.finished = True
        tail = []
        while (plan := self._plan(s)) is not None:
            tail += self._run([(sid, s, *plan)])[sid]
        del self.streams[sid]
        self.free.append(s.slot)
        tail = Samples(tail).result()  # the stream's last wait (per finished stream, not per call)
        head = np.zeros(0, np.float32)
        if s.generated == 0:
            return StreamEnd(head, np.zeros(0, np.float32))
        if s.ref_frames:
            total = s.ref_frames + s.generated
            cut = int(s.ref_frames / total * (total * self.spf))
            assert s.ref_frames * self.spf - cut in (0, 1), cut
            if cut < s.ref_frames * self.spf:
                head = s.lead.result()
        return StreamEnd(head, tail)

    def discard(self, sid: int) -> None:
        """Forget `sid` without decoding what is left (a failed or abandoned request) and free its slot."""
        self.broken.pop(sid, None)
        s = self.streams.pop(sid, None)
        if s is not None:
            self.free.append(s.slot)

    # -- decoding ----------------------------------------------------------------------------------------

    def pump(self) -> dict[int, np.ndarray]:
        """Decode every ready stream's chunks; returns the new samples per stream (waits for them)."""
        return {sid: samples.result() for sid, samples in self.pump_later().items()}

    def pump_later(self) -> dict[int, Samples]:
        """`pump` without the wait: the new samples per stream, read from the device by `result()`.

        Each round is one batched call per call size over all ready streams; rounds repeat while some
        stream is still ready (a backlog, or the 25 context frames re-fed after a window boundary).
        """
        out: dict[int, list] = {}
        held = self._held()
        while jobs := [(sid, s, *plan) for sid, s in self.streams.items()
                       if sid not in self.broken and sid not in held and (plan := self._plan(s)) is not None]:
            for size in sorted({self._call_frames(job) for job in jobs}):
                group = [j for j in jobs if self._call_frames(j) == size]
                step = self.row_buckets[-1] if self.fixed else (self.max_rows or len(group))
                for at in range(0, len(group), step):
                    for sid, pieces in self._run_isolated(group[at:at + step]).items():
                        out.setdefault(sid, []).extend(pieces)
        return {sid: Samples(p) for sid, p in out.items() if p}

    def _call_frames(self, job) -> int:
        """Frames of the call that runs `job` (sid, stream, frames, ends_window): its own, or padded (fixed)."""
        if not self.fixed:
            return job[2]
        return self.final_frames if job[3] else self.chunk

    def _held(self) -> set[int]:
        """The streams whose ready chunks wait for others this pump (`gather`); counts their wait."""
        if not self.gather:
            return set()
        live = [s for sid, s in self.streams.items() if sid not in self.broken and not s.finished]
        # Only a full chunk inside a window waits (`_plan` returns (chunk, False) for those and nothing
        # else): a window's end and a finished stream's rest run at once.
        ready = {sid: s for sid, s in self.streams.items()
                 if sid not in self.broken and not s.finished and self._plan(s, peek=True) == (self.chunk, False)}
        if not ready or 2 * len(ready) >= len(live) or max(s.waited for s in ready.values()) >= self.gather:
            for s in ready.values():
                s.waited = 0
            return set()
        for s in ready.values():
            s.waited += 1
        return set(ready)

    def _run_isolated(self, jobs) -> dict[int, list]:
        """`_run(jobs)`; if it raises, each job alone, and a job that still raises goes to `broken`."""
        try:
            return self._run(jobs)
        except Exception as exc:  # noqa: BLE001 - one request's frames must not stop the others' audio
            if len(jobs) == 1:
                self.broken[jobs[0][0]] = exc
                return {}
        out = {}
        for job in jobs:
            out.update(self._run_isolated([job]))
        return out

    def _plan(self, s: _Stream, peek: bool = False):
        """(frames, window ends here) for the next call of `s`, or None if not ready.

        At an official window boundary this also resets the stream's state rows and re-feeds the context
        (not with `peek`, which only asks: then a boundary's stream counts as not ready).
        """
        if s.pos == s.window_len and len(s.feed):  # official window boundary: start fresh, re-prime
            if peek:
                return None
            with self._on_stream():
                for t in self.state.values():
                    t[s.slot] = 0
            s.feed = np.concatenate([s.history[-self.left_context:], s.feed])
            s.drop += len(s.history[-self.left_context:]) * self.spf
            s.window_len, s.pos, s.base = self.left_context + self.window_frames, 0, 0
        left = s.window_len - s.pos
        known = len(s.feed) >= left or s.finished  # this window's final length is known
        remaining = min(left, len(s.feed))
        if remaining == 0:
            return None
        if known and remaining < self.chunk + HOLD:
            # The last call of a window runs unpadded, alone or with rows of the same length: padding
            # it to whole chunks so more rows batch together decoded ~14 dummy frames per request
            # (~20% more decode on 20-100 frame requests), while a separate call costs little.
            return remaining, True
        if remaining >= self.chunk + HOLD:
            return self.chunk, False
        return None

    def _run(self, jobs) -> dict[int, list]:
        """One batched step for `jobs` [(sid, stream, frames, ends_window)], all of the same frames (of the same
        padded call, `fixed`)."""
        if self.fixed:
            return self._run_fixed(jobs)
        size = jobs[0][2]
        codes = np.stack([s.feed[:size] for _, s, _, _ in jobs])
        start, base, kv_len = [], [], []
        for _, s, _, ends in jobs:
            start.append(s.pos)
            base.append(s.base)
            kv_len.append(s.pos - s.base + size if ends else round_up(s.pos - s.base + size, KV_ALIGN))
        # One upload for the call: the rows' slots, then their frames (built on the host).
        slots = np.array([s.slot for _, s, *_ in jobs], dtype=np.int64)
        packed = self.codec.upload(torch.from_numpy(np.concatenate([slots, codes.reshape(-1)])))
        slots, frames = packed[:len(jobs)], packed[len(jobs):].view(codes.shape)
        state = {k: v[slots] for k, v in self.state.items()}
        wav, state = self.codec.step(frames.transpose(1, 2), state, start, base, kv_len)
        for k, v in state.items():
            self.state[k][slots] = v
        copy = _HostCopy(self.to_host(wav[:, 0].float()))  # the one device->host copy of this call, read later
        return self._advance(jobs, copy)

    def _run_fixed(self, jobs) -> dict[int, list]:
        """`_run` as a call of a fixed shape: rows padded to their bucket on the spare slot, frames to the call's
        (zeros after a row's own), inputs in the call's buffers (one upload), then its graph or eager step."""
        frames = self._call_frames(jobs[0])
        rows = next(b for b in self.row_buckets if b >= len(jobs))
        host = np.zeros((rows, 4 + 16 * frames), dtype=np.int64)  # `_Call.inputs`: padding rows on the spare slot
        host[:, 0] = self.spare
        for row, (_, s, size, _) in enumerate(jobs):
            host[row, :4] = s.slot, s.pos, s.base, next_base(s.pos + frames, self.codec.window) - s.base
            host[row, 4:].reshape(frames, 16)[:size] = s.feed[:size]
        with self._on_stream():
            call = self.calls.get((rows, frames))
            if call is None:
                call = self.calls[rows, frames] = _Call(self, rows, frames)
            call.inputs.copy_(self.codec.upload(torch.from_numpy(host)))
            call.run()
            # Read before the next replay rewrites the buffer: the copy is queued first, on the same stream.
            copy = _HostCopy(self.to_host(call.output[:len(jobs)]))
        return self._advance(jobs, copy)

    def _on_stream(self):
        """Where the state's device work goes: the graphs' own stream, if they have one (see `CallGraphs`)."""
        return self.graphs.on_stream() if self.graphs is not None else contextlib.nullcontext()

    def _advance(self, jobs, copy: _HostCopy) -> dict[int, list]:
        """Move each job's stream past the frames it ran; its samples are `copy`'s row of the same index."""
        out = {}
        for row, (sid, s, size, _) in enumerate(jobs):
            lo, hi = 0, size * self.spf  # this row's samples: [lo, hi) of its waveform
            fed, s.feed = s.feed[:size], s.feed[size:]
            s.history = np.concatenate([s.history, fed])[-self.left_context:]
            s.pos += size
            s.base = next_base(s.pos, self.codec.window)
            if s.drop:
                cut = min(s.drop, hi - lo)
                lo, s.drop = lo + cut, s.drop - cut
                if s.drop == 0 and s.ref_frames and s.lead is None and hi > lo:
                    s.lead, lo = _Kept(copy, row, lo), lo + 1
            elif s.ref_frames and s.lead is None and hi > lo:
                s.lead, lo = _Kept(copy, row, lo), lo + 1
            out[sid] = [(copy, row, lo, hi)] if hi > lo else []
        return out


class _Call:
    """One fixed call shape (rows, frames) of `CodecStreams`: its inputs on the device in one buffer (slot,
    start, base, keep, then the frames, per row: filled by one upload per call), its output buffer, and
    its graph (captured on the padding slot, so capture and warm-up touch no stream's state) or None."""

    def __init__(self, streams: CodecStreams, rows: int, frames: int):
        codec = streams.codec
        self.streams, self.rows, self.frames = streams, rows, frames
        self.inputs = torch.zeros(rows, 4 + 16 * frames, dtype=torch.long, device=codec.device)
        self.inputs[:, 0] = streams.spare
        self.output = torch.zeros(rows, frames * streams.spf, dtype=torch.float32, device=codec.device)
        self.graph = None
        if streams.graphs is not None:
            self.graph = streams.graphs.capture(self._step, [self.inputs, self.output, *streams.state.values()],
                                                self.output)

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    def _step(self) -> None:
        """The call itself: gather the rows' state, step, scatter it back, write the waveform; the same
        operations on every run (a graph's rule), whatever the buffers hold."""
        streams, state = self.streams, self.streams.state
        slots, start, base, keep = self.inputs[:, :4].T
        codes = self.inputs[:, 4:].reshape(self.rows, self.frames, 16).transpose(1, 2)  # (rows, 16, frames)
        wav, new = streams.codec.step_fixed(codes, {k: v[slots] for k, v in state.items()}, start, base, keep)
        for k, v in new.items():
            state[k][slots] = v
        self.output.copy_(wav[:, 0])


def _row_buckets(limit: int) -> list[int]:
    """Rows of the fixed-shape calls: 1, 2, 4, ... below `limit`, then `limit`."""
    sizes, size = [], 1
    while size < limit:
        sizes.append(size)
        size *= 2
    return sizes + [limit]


def _frames(codes) -> np.ndarray:
    if codes is None:
        return np.zeros((0, 16), dtype=np.int64)
    if isinstance(codes, torch.Tensor):
        codes = codes.detach().cpu().numpy()
    codes = np.asarray(codes, dtype=np.int64)
    assert codes.ndim == 2 and codes.shape[1] == 16, f"expected frames of shape (n, 16), got {codes.shape}"
    return codes
