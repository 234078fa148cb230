"""The running sequences' audio: each one's codec stream (`CodecStreams`), fed its new frames after every
engine step and decoded in chunks batched across streams. A step's decoded audio is read from the device at
the next step, once that step's frame is queued, so the host never waits for the codec while the device
could run a frame; a finished sequence's last audio is read when it finishes.

A sequence's tag is (its `JobState`, its piece index), as the pipeline adds it: audio read goes to the
item's joiner, or is held back until the stream closes where it may still change (an in-context clone's
stream, whose reference cut is known only at its end; an attempt a runaway retry may discard). A stream
whose decode raises is handed to `on_error(seq, exc)`, which fails its item.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..models.codec_streams import CodecStreams


@dataclass
class _Stream:
    """A sequence's codec stream: its id, audio held back (until the stream closes), frames pushed."""

    sid: int
    held: list = field(default_factory=list)
    pushed: int = 0


_NOTHING = _Stream(-1)


class AudioStreams:
    """The codec streams of an engine's sequences; see the module docstring."""

    def __init__(self, codec: CodecStreams, on_error: Callable[[object, Exception], None]):
        self.codec = codec
        self.on_error = on_error
        self.decoding: dict = {}  # engine Sequence -> its _Stream
        self.unread: list = []  # (Sequence, codec_streams.Samples) decoded, not yet read from the device

    def __contains__(self, seq) -> bool:
        return seq in self.decoding

    def step(self, running: list, finished: list) -> None:
        """After an engine step: read the last step's audio, feed the new frames of every sequence (`running`
        and the step's `finished`) whose item is not dropped to its stream, close the input of the finished
        ones, and decode what is ready, batched."""
        self.read()  # the last step's audio: this step's frame is queued, the device has work meanwhile
        seqs = [seq for seq in running + finished if not seq.tag[0].dropped]  # (reading may have failed some)
        for seq in seqs:
            if len(seq.frames) == self.decoding.get(seq, _NOTHING).pushed:
                continue
            if seq not in self.decoding:
                self.decoding[seq] = _Stream(self.codec.open(seq.prompt.ref_codes))
            state = self.decoding[seq]
            self.codec.push(state.sid, np.stack(seq.frames[state.pushed:]))
            state.pushed = len(seq.frames)
        for seq in finished:
            if seq in self.decoding and not seq.tag[0].dropped:
                self.codec.finish(self.decoding[seq].sid)
        started = time.perf_counter()
        decoded = self.codec.pump_later()
        for seq in seqs:  # streams whose decode raised: their items fail, the others go on
            state = self.decoding.get(seq)
            if state is not None and state.sid in self.codec.broken:
                self.on_error(seq, self.codec.broken[state.sid])
        if not decoded:
            return
        share = (time.perf_counter() - started) / len(decoded)
        for seq in seqs:
            state = self.decoding.get(seq)
            if state is not None and state.sid in decoded and not seq.tag[0].dropped:
                seq.tag[0].decode_s += share
                self.unread.append((seq, decoded[state.sid]))

    def read(self, only=None) -> None:
        """Hand decoded audio to its items, in decoding order (all of it, or `only` that sequence's):
        this is where the host waits for the codec's copies. A sink's errors are the run's (they raise)."""
        unread, self.unread = self.unread, []
        for seq, samples in unread:
            if only is not None and seq is not only:
                self.unread.append((seq, samples))
                continue
            state, (item, index) = self.decoding.get(seq), seq.tag
            if state is None or item.dropped:
                continue
            started = time.perf_counter()
            try:
                audio = finite(samples.result())
            except Exception as exc:  # noqa: BLE001 - a decode that fails when read fails its item only
                self.on_error(seq, exc)
                continue
            item.decode_s += time.perf_counter() - started
            if item.incremental and seq.prompt.ref_codes is None:
                item.joiner.add(index, audio)
            else:  # ICL: a leading sample is only known at the end; retries: may be discarded
                state.held.append(audio)

    def close(self, seq) -> np.ndarray:
        """The rest of finished `seq`'s audio, after what `read(seq)` handed on: what it held back and its
        stream's end. The stream is gone after; its decode's errors raise."""
        state = self.decoding[seq]
        end = self.codec.close(state.sid)  # (if it raises, the stream is still here for `discard` to free)
        del self.decoding[seq]
        return np.concatenate([finite(end.head), *state.held, finite(end.tail)])

    def discard(self, seq) -> None:
        """Forget `seq`'s codec stream, if it has one, without decoding the rest."""
        if seq in self.decoding:
            self.codec.discard(self.decoding.pop(seq).sid)
            self.unread = [(s, samples) for s, samples in self.unread if s is not seq]


def finite(audio: np.ndarray) -> np.ndarray:
    """`audio`, decoded, unless some sample is NaN or infinite: a file of those is noise or silence that no
    error would name (soundfile writes NaN as full scale), so its item fails instead."""
    if not np.isfinite(audio).all():
        raise FloatingPointError("the codec gave samples that are not numbers (NaN or infinity): a damaged "
                                 "checkpoint, or a --codec-dtype too narrow for it (float32 is the default)")
    return audio
