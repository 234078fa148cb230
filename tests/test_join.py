"""Joining piece audio with equal-power crossfades; per-piece seeds."""

from __future__ import annotations

import numpy as np
import pytest

from omnitts.engine.join import crossfade_samples, join_pieces, joint_fades, piece_seed

RATE = 24000


def test_length_is_sum_minus_one_fade_per_joint():
    rng = np.random.default_rng(0)
    fade = crossfade_samples(RATE, 50)
    assert fade == 1200
    for n in (1, 2, 3, 7):
        pieces = [rng.standard_normal(rng.integers(2 * fade, 5 * RATE)).astype(np.float32) for _ in range(n)]
        out = join_pieces(pieces, RATE, 50)
        assert out.dtype == np.float32
        assert len(out) == sum(map(len, pieces)) - (n - 1) * fade
    assert len(join_pieces([np.ones(1000)] * 3, 48000, 10)) == 3000 - 2 * 480


def test_outside_the_fades_the_pieces_are_copied_unchanged():
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal(n).astype(np.float32) for n in (5000, 4000, 6000))
    f = crossfade_samples(RATE, 20)
    out = join_pieces([a, b, c], RATE, 20)
    np.testing.assert_array_equal(out[:len(a) - f], a[:-f])
    start_b = len(a) - f
    np.testing.assert_array_equal(out[start_b + f:start_b + len(b) - f], b[f:-f])
    np.testing.assert_array_equal(out[-(len(c) - f):], c[f:])
    assert np.array_equal(join_pieces([a], RATE), a) and len(join_pieces([], RATE)) == 0


def test_fades_are_equal_power_and_smooth():
    f = crossfade_samples(RATE, 50)
    ones, zeros = np.ones(3 * f, np.float32), np.zeros(3 * f, np.float32)
    fade_out = join_pieces([ones, zeros], RATE)[2 * f:3 * f]  # piece a's gain through the joint
    fade_in = join_pieces([zeros, ones], RATE)[2 * f:3 * f]
    np.testing.assert_allclose(fade_out ** 2 + fade_in ** 2, 1.0, atol=1e-6)
    assert np.all(np.diff(fade_out) < 0) and np.all(np.diff(fade_in) > 0)
    assert fade_in[0] < 0.01 and fade_out[-1] < 0.01  # starts/ends near 0: no step at the fade edges
    # Two uncorrelated pieces of equal power keep that power through the joint (a linear fade dips ~3 dB).
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 200 * f)).astype(np.float32)
    out = join_pieces([a, b], RATE, 50 * 100)  # a long fade so the power estimate is tight
    middle = out[len(a) - 100 * f:len(a)]
    assert abs(10 * np.log10(np.mean(middle ** 2))) < 0.2


def test_short_pieces_shrink_their_fades_and_never_overlap_three_ways():
    rng = np.random.default_rng(3)
    fade = crossfade_samples(RATE, 50)
    for _ in range(50):
        lengths = [int(x) for x in rng.integers(0, 3 * fade, rng.integers(2, 8))]
        pieces = [np.ones(n, np.float32) for n in lengths]
        out = join_pieces(pieces, RATE, 50)
        fades = joint_fades(lengths, fade)
        assert fades == [min(fade, a // 2, b // 2) for a, b in zip(lengths, lengths[1:])]
        assert len(out) == sum(lengths) - sum(fades)
        # each piece's support, found by joining with only that piece non-zero
        spans = []
        for k in range(len(pieces)):
            solo = join_pieces([p if i == k else np.zeros_like(p) for i, p in enumerate(pieces)], RATE, 50)
            nz = np.flatnonzero(solo)
            spans.append((nz[0], nz[-1] + 1) if len(nz) else None)
        live = [s for s in spans if s]
        for (s0, e0), (s2, e2) in zip(live, live[2:]):
            assert e0 <= s2  # piece k and piece k+2 never overlap


def test_rejects_non_mono_and_negative_fades():
    with pytest.raises(ValueError, match="piece 1"):
        join_pieces([np.zeros(10), np.zeros((10, 2))], RATE)
    with pytest.raises(ValueError):
        join_pieces([np.zeros(10)], RATE, -1)


def test_piece_seeds():
    assert piece_seed(1234, 0) == 1234 and piece_seed(None, 0) is None and piece_seed(None, 3) is None
    seeds = {piece_seed(s, i) for s in range(20) for i in range(1, 20)}
    assert len(seeds) == 20 * 19  # distinct across items and pieces
    assert all(0 <= s < 2**63 for s in seeds)
    assert piece_seed(7, 5) == piece_seed(7, 5) != piece_seed(7, 6)
    assert piece_seed(7, 1) != piece_seed(8, 0) and piece_seed(7, 1) != 8
    with pytest.raises(ValueError):
        piece_seed(1, -1)


def test_stream_joiner_equals_join_pieces_for_any_arrival_order():
    """Chunks of any piece, in any order, of any length (including empty and short pieces)."""
    from omnitts.engine.join import StreamJoiner

    rng = np.random.default_rng(7)
    rate = 1000  # a 50-sample crossfade
    for _ in range(300):
        count = int(rng.integers(1, 5))
        lengths = [int(rng.choice([0, 1, 3, 20, 49, 50, 99, 100, 101, 150, 400])) for _ in range(count)]
        pieces = [rng.standard_normal(n).astype(np.float32) for n in lengths]
        out, sent = [], [0] * count
        joiner = StreamJoiner(count, rate, out.append)
        live = list(range(count))
        while live:
            k = int(rng.choice(live))
            if sent[k] >= lengths[k]:
                joiner.end(k)
                live.remove(k)
                continue
            step = int(rng.integers(1, 60))
            joiner.add(k, pieces[k][sent[k]:sent[k] + step])
            sent[k] += step
        assert joiner.finished
        joined = np.concatenate(out) if out else np.zeros(0, np.float32)
        assert np.array_equal(joined, join_pieces(pieces, rate)), lengths


def test_stream_joiner_holds_back_only_a_fade_of_the_current_piece():
    from omnitts.engine.join import StreamJoiner

    out = []
    joiner = StreamJoiner(2, 1000, out.append)
    joiner.add(0, np.ones(500, np.float32))
    assert sum(len(c) for c in out) == 450  # all but the 50 samples the next joint may fade
    joiner.add(1, np.ones(300, np.float32))  # piece 1 waits for piece 0 to end
    assert sum(len(c) for c in out) == 450
    joiner.end(0)
    assert sum(len(c) for c in out) == 500 + 300 - 50  # the joint is mixed; piece 1 (the last) streams on
