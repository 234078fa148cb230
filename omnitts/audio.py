"""Reading reference audio and writing synthesized audio.

Reference audio of any rate, channel count or format soundfile/librosa can read is loaded as the
official package does (librosa.load at its native rate, mono by channel average) and resampled with
librosa's default resampler to the rate the codec and speaker encoder expect.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

from .errors import AudioError

MIN_REFERENCE_SECONDS = 0.5
FORMATS = {"wav": "PCM_16", "flac": "PCM_16", "ogg": "VORBIS"}  # output suffix -> soundfile subtype


def load_reference(source, target_sr: int) -> np.ndarray:
    """A path, or a (samples, rate) pair -> mono float32 samples at `target_sr`."""
    import librosa

    if isinstance(source, tuple):
        wav, sr = np.asarray(source[0], dtype=np.float32), int(source[1])
        if wav.ndim > 1:
            wav = wav.mean(axis=-1)
        name = "reference audio"
    else:
        path = Path(source)
        name = str(path)
        if not path.is_file():
            raise AudioError(f"{path}: reference audio file not found")
        try:
            with warnings.catch_warnings():  # librosa warns while falling back to audioread; we raise instead
                warnings.simplefilter("ignore")
                wav, sr = librosa.load(str(path), sr=None, mono=True)
        except Exception as exc:  # soundfile/audioread raise many types; the file is what matters
            raise AudioError(f"{path}: cannot read audio ({type(exc).__name__}: {exc})") from None
    wav = np.asarray(wav, dtype=np.float32)
    if wav.size == 0 or wav.size < MIN_REFERENCE_SECONDS * sr:
        raise AudioError(f"{name}: reference audio is {wav.size / max(sr, 1):.2f} s long; "
                         f"at least {MIN_REFERENCE_SECONDS} s is needed")
    if not np.isfinite(wav).all():
        raise AudioError(f"{name}: reference audio contains NaN or infinite samples")
    if float(np.abs(wav).max()) < 1e-4:
        raise AudioError(f"{name}: reference audio is silent")
    if sr != target_sr:
        wav = librosa.resample(y=wav, orig_sr=sr, target_sr=target_sr)
    return wav.astype(np.float32)


def write_audio(path: Path, samples: np.ndarray, sample_rate: int) -> None:
    """Write `samples` atomically: to a temporary name in the same folder, then rename."""
    import soundfile as sf

    path = Path(path)
    kind = path.suffix.lower().lstrip(".")
    if kind not in FORMATS:
        raise ValueError(f"{path}: unsupported audio format {path.suffix!r}; use one of .{', .'.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        sf.write(tmp, samples, sample_rate, format=kind.upper(), subtype=FORMATS[kind])
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
