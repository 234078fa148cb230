"""BS.1770-4 loudness against the spec and pyloudnorm; normalization and the peak limiter."""

from __future__ import annotations

import numpy as np
import pytest

from omnitts.io.loudness import (
    DEFAULT_CEILING,
    HOLD_MS,
    LOOKAHEAD_MS,
    integrated_loudness,
    k_weighting,
    limiter_gain,
    normalize_loudness,
)

def speech_like(rate: int, seconds: float = 6.0, seed: int = 0) -> np.ndarray:
    """Voiced syllables (harmonics of a wandering pitch, 4 Hz envelope) in phrases with pauses."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 25))
    syllables = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) ** 2
    phrases = (np.sin(2 * np.pi * 0.35 * t + 0.5) > -0.3).astype(float)  # ~30 % pauses
    return (0.2 * voice * syllables * phrases + 0.002 * rng.standard_normal(len(t))).astype(np.float32)


def signals(rate: int) -> dict:
    rng = np.random.default_rng(rate)
    t = np.arange(rate * 5) / rate
    white = 0.1 * rng.standard_normal(len(t))
    spectrum = np.fft.rfft(rng.standard_normal(len(t)))
    pink = np.fft.irfft(spectrum / np.sqrt(np.maximum(np.arange(len(spectrum)), 1)), len(t))
    return {
        "white": white,
        "pink": 0.3 * pink / np.abs(pink).max(),
        "sine100": 0.5 * np.sin(2 * np.pi * 100 * t),
        "sine997": 0.25 * np.sin(2 * np.pi * 997 * t),
        "sine6k": 0.2 * np.sin(2 * np.pi * 6000 * t),
        "speech": speech_like(rate),
        "quiet_speech": 0.02 * speech_like(rate, 4.0, seed=1),
        "loud_then_quiet": np.concatenate([white, 0.003 * white]),  # the relative gate decides
    }


@pytest.mark.parametrize("rate", [24000, 48000])
def test_agrees_with_pyloudnorm_within_a_tenth_of_an_lu(rate):
    pyln = pytest.importorskip("pyloudnorm")  # in [test]; the other tests here run without it
    cases = signals(rate)
    cases["padded_speech"] = np.concatenate([np.zeros(rate), cases["speech"], np.zeros(2 * rate)])
    for name, x in cases.items():
        ours = integrated_loudness(x, rate)
        theirs = pyln.Meter(rate).integrated_loudness(np.asarray(x, dtype=np.float64))
        assert abs(ours - theirs) < 0.1, (name, ours, theirs)


def test_matches_the_spec_at_48k():
    (b1, a1), (b2, a2) = k_weighting(48000)  # BS.1770-4 table 1 and 2
    np.testing.assert_allclose(b1, [1.53512485958697, -2.69169618940638, 1.19839281085285], atol=1e-10)
    np.testing.assert_allclose(a1, [1.0, -1.69065929318241, 0.73248077421585], atol=1e-10)
    np.testing.assert_allclose(b2, [1.0, -2.0, 1.0], atol=1e-10)
    np.testing.assert_allclose(a2, [1.0, -1.99004745483398, 0.99007225036621], atol=1e-10)
    t = np.arange(48000 * 3) / 48000
    assert integrated_loudness(np.sin(2 * np.pi * 997 * t), 48000) == pytest.approx(-3.01, abs=0.01)
    # 6 dB more signal is 6 dB louder; the result does not depend much on the rate
    x = speech_like(48000)
    assert integrated_loudness(2 * x, 48000) - integrated_loudness(x, 48000) == pytest.approx(6.0206, abs=1e-3)
    assert integrated_loudness(speech_like(24000), 24000) == pytest.approx(integrated_loudness(x, 48000), abs=0.1)


def test_gating():
    rate = 24000
    x = signals(rate)["white"]
    assert integrated_loudness(np.zeros(rate * 2), rate) == float("-inf")
    assert integrated_loudness(x[:int(0.399 * rate)], rate) == float("-inf")  # no complete block
    assert np.isfinite(integrated_loudness(x[:int(0.4 * rate)], rate))
    # silence and a passage 50 dB down are gated out (absolute / relative gate)
    # Silence only adds blocks below -70 LUFS, which the absolute gate drops, however much is added
    # (the blocks straddling the edges are partly silent, hence `padded` vs `more`, not vs x).
    padded = np.concatenate([np.zeros(rate * 1), x, np.zeros(rate * 1)])
    more = np.concatenate([np.zeros(rate * 30), x, np.zeros(rate * 20)])
    assert integrated_loudness(more, rate) == pytest.approx(integrated_loudness(padded, rate), abs=1e-9)
    assert integrated_loudness(padded, rate) == pytest.approx(integrated_loudness(x, rate), abs=0.5)
    # A stretch 40-50 dB down (above -70 LUFS) is dropped by the relative gate: its level does not
    # matter (ungated, the mean of the two halves would read ~3 dB lower).
    tail_40, tail_50 = np.concatenate([x, 0.01 * x]), np.concatenate([x, 0.003 * x])
    assert integrated_loudness(tail_40, rate) == pytest.approx(integrated_loudness(tail_50, rate), abs=0.01)
    assert integrated_loudness(tail_40, rate) == pytest.approx(integrated_loudness(x, rate), abs=0.2)
    assert integrated_loudness(1e-5 * x, rate) == float("-inf")  # below -70 LUFS


@pytest.mark.parametrize("rate", [24000, 48000])
def test_normalize_hits_the_target_when_no_limiting_is_needed(rate):
    cases = signals(rate)
    for name in ("speech", "pink", "quiet_speech"):
        x = cases[name]
        y = normalize_loudness(x, rate, -26.0)
        assert y.dtype == np.float32 and y.shape == x.shape
        assert integrated_loudness(y, rate) == pytest.approx(-26.0, abs=0.01), name
        assert np.abs(y).max() < DEFAULT_CEILING
        np.testing.assert_allclose(y / y.max(), x / x.max(), atol=1e-5)  # a pure gain


def test_limiter_keeps_peaks_under_the_ceiling_and_leaves_quiet_passages_alone():
    rate = 24000
    x = speech_like(rate)
    x[rate:rate + 10] = 0.9  # a click far above the speech peaks
    quiet = np.arange(int(4.5 * rate), int(4.9 * rate))
    x[quiet] *= 0.05  # a quiet stretch, far from any loud peak after normalization
    y = normalize_loudness(x, rate, -9.0)  # loud target: the limiter must work hard
    assert np.abs(y).max() <= DEFAULT_CEILING + 1e-7
    gain = 10 ** ((-9.0 - integrated_loudness(x, rate)) / 20)
    assert np.abs(x * gain).max() > 2 * DEFAULT_CEILING  # would clip without the limiter
    np.testing.assert_allclose(y[quiet], (x[quiet] * gain).astype(np.float32), rtol=1e-6, atol=1e-7)
    assert integrated_loudness(y, rate) < -9.0  # the ceiling wins over the target
    for ceiling in (0.5, 0.99):
        assert np.abs(normalize_loudness(x, rate, -9.0, ceiling=ceiling)).max() <= ceiling + 1e-7


def test_limiter_gain_envelope_is_smooth_looks_ahead_and_releases():
    rate = 48000
    x = np.full(rate, 0.5)
    peak = rate // 2
    x[peak] = 2.0
    g = limiter_gain(x, rate)
    assert g[peak] * 2.0 <= DEFAULT_CEILING + 1e-12 and np.all(g * np.abs(x) <= DEFAULT_CEILING + 1e-12)
    ahead, hold = int(LOOKAHEAD_MS * rate / 1000), int(HOLD_MS * rate / 1000)
    assert g[peak - ahead // 2] < 1  # already falling before the peak
    assert np.all(g[:peak - ahead - 1] == 1) and np.all(g[peak + hold + ahead + 1:] == 1)
    assert np.abs(np.diff(g)).max() < 4 * (1 - g.min()) / ahead  # a glide, no steps
    np.testing.assert_allclose(g[peak:peak + hold - ahead], g[peak])  # held through the hold time
    assert np.array_equal(limiter_gain(0.5 * np.sin(np.arange(1000)), rate), np.ones(1000))


def test_silent_or_short_input_is_returned_unchanged():
    rate = 24000
    for x in (np.zeros(rate, np.float32), 0.5 * np.ones(int(0.3 * rate), np.float32), np.zeros(0, np.float32)):
        y = normalize_loudness(x, rate, -16.0)
        assert np.array_equal(x, y) and y.dtype == np.float32
    with pytest.raises(ValueError):
        normalize_loudness(np.zeros((10, 2)), rate, -16.0)
    with pytest.raises(ValueError):
        normalize_loudness(np.array([0.0, np.nan]), rate, -16.0)
