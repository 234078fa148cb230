"""Integrated loudness (ITU-R BS.1770-4 / EBU R128) and loudness normalization with a peak limiter.

`integrated_loudness(samples, rate)` measures a mono signal in LUFS at any sample rate:
- K-weighting, two biquads (a +4 dB high shelf near 1.7 kHz modelling the head, then a ~38 Hz
  high-pass), derived from their analog prototypes for the actual rate by the bilinear transform
  with prewarping; at 48 kHz this reproduces the coefficients tabulated in BS.1770, and the
  high-pass keeps that table's passband gain at every rate;
- mean square over 400 ms blocks with 75 % overlap (a block every 100 ms; only complete blocks);
  block loudness -0.691 + 10·log10(mean square), the single channel weighted 1;
- absolute gate: blocks at or above -70 LUFS; relative gate: blocks above the mean of those minus 10 LU;
  the result is -0.691 + 10·log10 of the mean square of the blocks that pass both.
Input shorter than one block, or with no block above the gates (silence), measures -inf.

`normalize_loudness(samples, rate, target_lufs)` scales the signal to `target_lufs`, then runs a
look-ahead peak limiter so no sample exceeds `ceiling` (default -1 dBFS ≈ 0.891):
- required gain per sample r = min(1, ceiling / |x|);
- hold: the minimum of r over a window from `HOLD_MS` before to `LOOKAHEAD_MS` after each sample;
- smoothing: a normalised Hann kernel `LOOKAHEAD_MS` long, applied causally to the held gain, so
  the gain glides down over the look-ahead before a peak and back up after the hold, with no steps.
  Every kernel tap sees a held minimum that includes the peak, so the smoothed gain at a peak is at
  most the gain it needs: the ceiling holds exactly (a final clip only absorbs float rounding).
Samples farther than hold + look-ahead from any over-ceiling peak get gain exactly 1, so quiet
passages are only scaled by the normalization gain. Input whose loudness is -inf (silent, or
shorter than 400 ms) is returned unchanged (as float32): there is nothing to measure.
The ceiling wins over the target: when reaching the target would push peaks over the ceiling, the
limited result measures below the target (by about as much as the peaks were reduced on the loud
stretches). Typical targets (-23, -16 LUFS) leave speech peaks below -1 dBFS, untouched.
"""

from __future__ import annotations

import math

import numpy as np

BLOCK_SECONDS = 0.4
STEP_SECONDS = 0.1  # 75 % overlap
ABSOLUTE_GATE_LUFS = -70.0
RELATIVE_GATE_LU = -10.0
DEFAULT_CEILING = 10 ** (-1 / 20)  # -1 dBFS
LOOKAHEAD_MS = 5.0
HOLD_MS = 40.0

# Analog prototypes of the K-weighting stages (those that give BS.1770's 48 kHz coefficients).
_SHELF_HZ, _SHELF_DB, _SHELF_Q = 1681.974450955533, 3.999843853973347, 0.7071752369554196
_SHELF_VB_EXP = 0.4996667741545416  # band gain Vb = Vh ** this
_HIGHPASS_HZ, _HIGHPASS_Q = 38.13547087602444, 0.5003270373238773


def k_weighting(rate: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """The two K-weighting biquads at `rate` as (b, a) coefficient pairs, a[0] = 1."""
    k = math.tan(math.pi * _SHELF_HZ / rate)
    vh = 10 ** (_SHELF_DB / 20)
    vb = vh ** _SHELF_VB_EXP
    a0 = 1 + k / _SHELF_Q + k * k
    shelf = (np.array([vh + vb * k / _SHELF_Q + k * k, 2 * (k * k - vh), vh - vb * k / _SHELF_Q + k * k]) / a0,
             np.array([a0, 2 * (k * k - 1), 1 - k / _SHELF_Q + k * k]) / a0)
    a0 = _highpass_a0(rate)
    k = math.tan(math.pi * _HIGHPASS_HZ / rate)
    # BS.1770's 48 kHz table has b = [1, -2, 1], a passband gain of a0(48 kHz) ≈ +0.04 dB; keep that
    # gain at every rate (unscaled, it would grow with K: +0.13 dB at 16 kHz).
    highpass = (np.array([1.0, -2.0, 1.0]) * _highpass_a0(48000) / a0,
                np.array([a0, 2 * (k * k - 1), 1 - k / _HIGHPASS_Q + k * k]) / a0)
    return [shelf, highpass]


def _highpass_a0(rate: float) -> float:
    k = math.tan(math.pi * _HIGHPASS_HZ / rate)
    return 1 + k / _HIGHPASS_Q + k * k


def block_loudness(samples: np.ndarray, rate: float) -> np.ndarray:
    """Loudness (LUFS) of each complete 400 ms block, one every 100 ms; -inf for silent blocks."""
    from scipy.signal import lfilter

    x = _mono(samples)
    for b, a in k_weighting(rate):
        x = lfilter(b, a, x)
    size, step = int(round(BLOCK_SECONDS * rate)), STEP_SECONDS * rate
    if len(x) < size:
        return np.zeros(0)
    starts = np.round(np.arange(int((len(x) - size) // step) + 1) * step).astype(np.int64)
    starts = starts[starts + size <= len(x)]
    energy = np.concatenate([[0.0], np.cumsum(x * x)])
    mean_square = np.maximum(energy[starts + size] - energy[starts], 0.0) / size
    with np.errstate(divide="ignore"):
        return -0.691 + 10 * np.log10(mean_square)


def integrated_loudness(samples: np.ndarray, rate: float) -> float:
    """Gated integrated loudness of mono `samples` in LUFS (-inf if silent or shorter than 400 ms)."""
    blocks = block_loudness(samples, rate)
    power = 10 ** ((blocks + 0.691) / 10)  # mean square per block
    kept = blocks >= ABSOLUTE_GATE_LUFS
    if not kept.any():
        return float("-inf")
    relative = -0.691 + 10 * math.log10(power[kept].mean()) + RELATIVE_GATE_LU
    kept &= blocks > relative
    if not kept.any():
        return float("-inf")
    return float(-0.691 + 10 * math.log10(power[kept].mean()))


def normalize_loudness(samples: np.ndarray, rate: float, target_lufs: float,
                       ceiling: float = DEFAULT_CEILING) -> np.ndarray:
    """`samples` scaled to `target_lufs` integrated loudness, peaks limited to `ceiling` -> float32."""
    if not 0 < ceiling <= 1:
        raise ValueError(f"ceiling must be in (0, 1], got {ceiling}")
    x = _mono(samples)
    loudness = integrated_loudness(x, rate)
    if not math.isfinite(loudness):
        return np.asarray(samples, dtype=np.float32)
    y = x * 10 ** ((target_lufs - loudness) / 20)
    y = y * limiter_gain(y, rate, ceiling)
    return np.clip(y, -ceiling, ceiling).astype(np.float32)


def limiter_gain(samples: np.ndarray, rate: float, ceiling: float = DEFAULT_CEILING) -> np.ndarray:
    """Per-sample gain in (0, 1] keeping |samples · gain| <= ceiling (see the module docstring)."""
    from scipy.ndimage import minimum_filter1d

    peak = np.abs(np.asarray(samples, dtype=np.float64))
    need = np.minimum(1.0, ceiling / np.maximum(peak, 1e-30))
    if need.min() >= 1.0:
        return np.ones_like(need)
    ahead = max(1, int(round(LOOKAHEAD_MS * rate / 1000)))
    hold = int(round(HOLD_MS * rate / 1000))
    # held[n] = min(need[n - hold .. n + ahead - 1]); the causal Hann below reaches ahead - 1 samples
    # back, so every tap that contributes at a peak sees a held minimum that includes the peak.
    width = hold + ahead
    held = minimum_filter1d(need, size=width, mode="nearest", origin=hold - width // 2)
    kernel = np.hanning(ahead + 2)[1:-1]  # strictly positive taps
    kernel /= kernel.sum()
    # causal: gain[n] = sum_j kernel[j] * held[n - j], edges padded with the edge value; smoothed as
    # a reduction (1 - gain) so untouched stretches stay exactly 1.
    reduction = 1.0 - np.concatenate([np.full(ahead - 1, held[0]), held])
    return 1.0 - np.clip(np.convolve(reduction, kernel, mode="valid"), 0.0, 1.0)


def _mono(samples) -> np.ndarray:
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"expected mono 1-D samples, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("samples contain NaN or infinite values")
    return x
