"""Joining the audio of a long text's pieces, and the seed each piece is sampled with.

`join_pieces` lays the pieces end to end, overlapping each joint by a short **equal-power**
crossfade (fade-out cos, fade-in sin, so gain_out² + gain_in² = 1). The two sides of a joint are
different utterances, i.e. uncorrelated signals, whose powers add: equal-power keeps the level
constant through the joint, where a linear fade would dip by 3 dB in the middle. The fade only has
to hide the discontinuity between two pieces (each normally ends and starts in near-silence), so
it is short: `DEFAULT_CROSSFADE_MS` = 50 ms.

Length: the fade at the joint between pieces k and k+1 is
`f_k = min(crossfade_samples, len(piece_k) // 2, len(piece_k+1) // 2)` samples, so a fade never
covers more than half of a piece and no three pieces overlap; the output has
`sum(len(p)) - sum(f_k)` samples, which is `sum(len(p)) - (n - 1) * crossfade_samples` whenever
every piece has at least 2 × crossfade samples. `crossfade_samples = round(crossfade_ms * rate / 1000)`.

Seeds: `piece_seed(item_seed, index)` gives piece 0 the item's own seed, so a text that fits in one
piece sounds exactly as it did unsplit, and each later piece a seed hashed from (item seed, index),
so pieces do not replay the same random stream and the whole item stays reproducible. An item
without a seed (None) gives None for every piece (each piece draws a fresh seed).
"""

from __future__ import annotations

import numpy as np

from ..params import derive_seed

DEFAULT_CROSSFADE_MS = 50.0


def crossfade_samples(sample_rate: int, crossfade_ms: float = DEFAULT_CROSSFADE_MS) -> int:
    """The nominal fade length in samples."""
    if crossfade_ms < 0:
        raise ValueError(f"crossfade_ms must be >= 0, got {crossfade_ms}")
    return int(round(crossfade_ms * sample_rate / 1000))


def joint_fades(lengths: list[int], fade: int) -> list[int]:
    """Fade length of each of the n-1 joints (see the module docstring)."""
    return [min(fade, a // 2, b // 2) for a, b in zip(lengths, lengths[1:])]


def join_pieces(pieces: list[np.ndarray], sample_rate: int,
                crossfade_ms: float = DEFAULT_CROSSFADE_MS) -> np.ndarray:
    """The pieces' mono samples joined in order with equal-power crossfades -> float32 samples."""
    arrays = [np.asarray(p, dtype=np.float32) for p in pieces]
    for i, a in enumerate(arrays):
        if a.ndim != 1:
            raise ValueError(f"piece {i}: expected mono 1-D samples, got shape {a.shape}")
    if not arrays:
        return np.zeros(0, dtype=np.float32)
    lengths = [len(a) for a in arrays]
    fades = joint_fades(lengths, crossfade_samples(sample_rate, crossfade_ms))
    out = np.zeros(sum(lengths) - sum(fades), dtype=np.float32)
    pos = 0
    for i, a in enumerate(arrays):
        a = a.copy()
        if i > 0 and fades[i - 1]:
            a[:fades[i - 1]] *= _fade_in(fades[i - 1])
        if i < len(fades) and fades[i]:
            a[len(a) - fades[i]:] *= _fade_in(fades[i])[::-1]  # cos fade-out = time-reversed sin fade-in
        out[pos:pos + len(a)] += a
        pos += len(a) - (fades[i] if i < len(fades) else 0)
    assert pos == len(out)
    return out


def _fade_in(n: int) -> np.ndarray:
    t = (np.arange(n, dtype=np.float64) + 0.5) / n  # sample centres, symmetric: in[k]² + in[n-1-k]² = 1
    return np.sin(0.5 * np.pi * t).astype(np.float32)


def piece_seed(item_seed: int | None, index: int) -> int | None:
    """The seed of piece `index` of an item seeded `item_seed` (piece 0 keeps it; None stays None)."""
    return derive_seed(item_seed, "piece", index)


class StreamJoiner:
    """`join_pieces`, incrementally: piece samples arrive in chunks, the joined signal leaves in order.

    `add(index, samples)` appends to piece `index` (pieces may progress in any order); `end(index)`
    says piece `index` is complete. Output goes to `emit(chunk)` as soon as it is final: the current
    piece streams through, except its last crossfade's worth of samples (held for the next joint),
    and a later piece waits in memory until the pieces before it end. Everything emitted, concatenated,
    equals `join_pieces(pieces)` exactly (the same float operations in the same order).
    """

    def __init__(self, count: int, sample_rate: int, emit, crossfade_ms: float = DEFAULT_CROSSFADE_MS):
        self.fade = crossfade_samples(sample_rate, crossfade_ms)
        self.emit = emit
        self.count = count
        self.pending = [[] for _ in range(count)]  # samples received and not yet emitted, per piece
        self.lengths = [0] * count  # samples received per piece
        self.ended = [False] * count
        self.current = 0  # the first piece not fully emitted
        self.head_done = True  # whether the current piece's leading joint has been mixed
        self.tail = np.zeros(0, dtype=np.float32)  # held end of the previous piece (its fade-out side)

    def add(self, index: int, samples: np.ndarray) -> None:
        samples = np.asarray(samples, dtype=np.float32)
        assert not self.ended[index], f"piece {index} already ended"
        if len(samples):
            self.pending[index].append(samples)
            self.lengths[index] += len(samples)
            self._flush()

    def end(self, index: int) -> None:
        self.ended[index] = True
        self._flush()

    @property
    def finished(self) -> bool:
        return self.current == self.count

    def _flush(self) -> None:
        while self.current < self.count:
            k, fade = self.current, self.fade
            last, ended, length = k == self.count - 1, self.ended[k], self.lengths[k]
            if not self.head_done:
                if not ended and length < 2 * fade:
                    return  # this joint's fade length still depends on how long piece k gets
                f = min(fade, self.lengths[k - 1] // 2, length // 2 if ended else fade)
                body = self._take(k, len(self._pending(k)))
                held = self.tail
                out_prev = held[: len(held) - f]
                mixed = held[len(held) - f:] * _fade_in(f)[::-1] + body[:f] * _fade_in(f) if f else body[:0]
                self.emit(np.concatenate([out_prev, mixed]))
                self.pending[k] = [body[f:]] if len(body) > f else []
                self.head_done, self.tail = True, np.zeros(0, dtype=np.float32)
            buffered = self._pending(k)
            if last:
                if len(buffered):
                    self.emit(self._take(k, len(buffered)))
                if not ended:
                    return
            elif not ended:
                if len(buffered) > fade:  # hold the last `fade` samples for the next joint
                    self.emit(self._take(k, len(buffered) - fade))
                return
            else:  # piece k complete: keep at most the longest fade its next joint can have
                hold = min(fade, length // 2)
                if len(buffered) > hold:
                    self.emit(self._take(k, len(buffered) - hold))
                self.tail = self._take(k, len(self._pending(k)))
            self.current += 1
            self.head_done = False  # the next piece starts with a joint

    def _pending(self, k: int) -> np.ndarray:
        if len(self.pending[k]) > 1:
            self.pending[k] = [np.concatenate(self.pending[k])]
        return self.pending[k][0] if self.pending[k] else np.zeros(0, dtype=np.float32)

    def _take(self, k: int, n: int) -> np.ndarray:
        """The first `n` pending samples of piece k (removed from pending)."""
        buffered = self._pending(k)
        taken, rest = buffered[:n], buffered[n:]
        self.pending[k] = [rest] if len(rest) else []
        return taken
