"""Reading reference audio and writing synthesized audio.

Reference audio of any rate, channel count or format soundfile/librosa can read is loaded as the
official package does (librosa.load at its native rate, mono by channel average) and resampled with
librosa's default resampler to the rate the codec and speaker encoder expect.

A reference is at most `MAX_REFERENCE_SECONDS` long, so one clip's memory and prompt length are
bounded (a 10-minute clip would otherwise cost gigabytes and hundreds of prompt frames). Only that
much is ever read from a file. In-context cloning needs the transcript of exactly the audio used, so
a longer clip is refused there; the speaker embedding alone (`x_vector_only`) uses its first
`MAX_REFERENCE_SECONDS`, with a warning.

Samples given as a `(samples, sample_rate)` pair are float audio in [-1, 1] (past `MAX_FLOAT_PEAK` they are
refused, as a float file's are: integer PCM cast to float, on another scale), or integer PCM as
`scipy.io.wavfile` and `soundfile` return it (int16, int32, int8, uint8), scaled to [-1, 1) as
soundfile scales it; other integer types (int64, uint16, ...) have no PCM meaning and are refused.
Paths may start with `~` (the home folder).
"""

from __future__ import annotations

import errno
import numbers
import os
import sys
import warnings
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np

from ..errors import AudioError
from . import unreachable, user_path
from .atomic import DISK_FULL, atomic_write, temp_name

MIN_REFERENCE_SECONDS = 0.5
MAX_REFERENCE_SECONDS = 30.0  # the official examples use clips of a few seconds
# Float samples (a pair's, a float file's) peak here at most: a full-scale clip resampled or filtered overshoots 1 a
# little; past +6 dBFS they are on another scale (int16 PCM as float peaks in the thousands), a voice no error names.
MAX_FLOAT_PEAK = 2.0
SILENT_PEAK = 1e-4  # a clip that peaks below it (-80 dBFS) is silent
FORMATS = {"wav": "PCM_16", "flac": "PCM_16", "ogg": "VORBIS"}  # output suffix -> soundfile subtype
# The highest rate each holds (an Audio built by hand may have any): libsndfile refuses a FLAC one past it naming the
# temporary file, and libvorbis crashes the process on a Vorbis one (WAV's header holds a 32-bit rate)
MAX_RATES = {"wav": 2**31 - 1, "flac": 655350, "ogg": 200000}
SF_ERR_SYSTEM = 2  # libsndfile's code for a failed system call ("System error.")
# Integer PCM -> (offset, scale) to [-1, 1), as soundfile reads each subtype as float (uint8 is offset binary).
PCM = {np.dtype(np.int8): (0, 2**7), np.dtype(np.int16): (0, 2**15), np.dtype(np.int32): (0, 2**31),
       np.dtype(np.uint8): (128, 2**7)}
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # omnitts/, for warnings
_DECORATOR = os.path.join("torch", "utils", "_contextlib.py")  # torch.inference_mode on an API method


def not_a_file(path: Path) -> str:
    """What is at `path`, which is no regular file: "file not found" only where nothing is (/dev/null, a pipe
    such as bash's <(...), were said to be missing)."""
    if path.is_dir():
        return "is a directory, not an audio file"
    if path.exists():
        return "is not a regular file (a device or a pipe), not an audio file"
    return "file not found"


def load_reference(source, target_sr: int, truncate: bool = False) -> np.ndarray:
    """A path, or a (samples, rate) pair -> mono float32 samples at `target_sr`.

    A clip longer than `MAX_REFERENCE_SECONDS` raises AudioError, or with `truncate` (a speaker
    embedding only) is cut to that length with a UserWarning (pointing at the caller's code, not
    omnitts'); a file is never read further than that. Integer samples in a pair are PCM, scaled
    (see the module docstring); a path may start with `~`.
    """
    import librosa

    if isinstance(source, tuple):
        name = "ref_audio"  # the field: a pair has no file name to begin its messages with
        wav, sr = _samples(source, name)
    else:
        path = user_path(source, "ref_audio")
        name = str(path)
        if why := unreachable(path):
            raise AudioError(f"{path}: cannot read audio ({why})")
        if not path.is_file():
            raise AudioError(f"{path}: reference audio {not_a_file(path)}")
        if path.stat().st_size == 0:
            raise AudioError(f"{path}: reference audio file is empty (0 bytes)")
        try:
            with warnings.catch_warnings():  # librosa warns while falling back to audioread; we raise instead
                warnings.simplefilter("ignore")
                # A little past the limit, to tell a clip of exactly the limit from a longer one.
                # Not mono=True: librosa's mix-down refuses NaN first, in words of its own (check_samples says it).
                wav, sr = librosa.load(str(path), sr=None, mono=False, duration=MAX_REFERENCE_SECONDS + 0.5)
        except Exception as exc:  # soundfile/audioread raise many types; the file is what matters
            why = f"{type(exc).__name__}: {exc}" if str(exc).strip() else "not a format soundfile or audioread decodes"
            raise AudioError(f"{path}: cannot read audio ({why})") from None
        wav = mono(wav, 0, name) if wav.ndim > 1 else wav  # (channels, n) -> (n,), as librosa.to_mono
    wav = np.asarray(wav, dtype=np.float32)
    limit = int(MAX_REFERENCE_SECONDS * sr)
    if wav.size > limit:
        if not truncate:
            raise AudioError(f"{name}: reference audio is longer than {MAX_REFERENCE_SECONDS:g} s; in-context "
                             f"cloning needs the transcript of exactly the audio used: trim the clip (and its "
                             f"ref_text) to at most {MAX_REFERENCE_SECONDS:g} s, or set x_vector_only")
        warnings.warn(f"{name}: reference audio is longer than {MAX_REFERENCE_SECONDS:g} s; its first "
                      f"{MAX_REFERENCE_SECONDS:g} s are used for the speaker embedding", UserWarning,
                      stacklevel=_caller_level())
        wav = wav[:limit]
    if wav.size == 0 or wav.size < MIN_REFERENCE_SECONDS * sr:
        raise AudioError(f"{name}: reference audio is {wav.size / max(sr, 1):.2f} s long; "
                         f"at least {MIN_REFERENCE_SECONDS} s is needed")
    check_samples(wav, name)
    if sr != target_sr:
        wav = librosa.resample(y=wav, orig_sr=sr, target_sr=target_sr)
    return wav.astype(np.float32)


def resampled_length(samples: int, orig_sr: int, target_sr: int) -> int:
    """The samples `load_reference` gives for `samples` samples read at `orig_sr`, resampled to `target_sr`:
    librosa.resample fixes the length to ceil(samples * target_sr / orig_sr), computed as it computes it."""
    return samples if orig_sr == target_sr else int(np.ceil(samples * (float(target_sr) / orig_sr)))


def _caller_level() -> int:
    """The `stacklevel` of the nearest frame outside omnitts (and torch's decorator around its methods), for a
    warning of `load_reference`: it then names the user's call (`clone_voice`, `synthesize`, ...), not a line of
    the library; 2 (the caller) where every frame is omnitts' (its command line shows warnings its own way)."""
    frame, level = sys._getframe(2), 2  # load_reference's caller
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE)
                                 or frame.f_code.co_filename.endswith(_DECORATOR)):
        frame, level = frame.f_back, level + 1
    return 2 if frame is None else level


def check_samples(wav: np.ndarray, name: str) -> None:
    """AudioError unless a reference clip's samples are finite, on the scale of audio (`MAX_FLOAT_PEAK`) and not
    silent (manifest checks use it too)."""
    if not np.isfinite(wav).all():
        raise AudioError(f"{name}: reference audio contains NaN or infinite samples")
    if (peak := float(np.abs(wav).max(initial=0))) > MAX_FLOAT_PEAK:
        raise AudioError(f"{name}: float samples peak at {peak:g}; audio is in [-1, 1] (integer PCM cast to or stored "
                         "as float? divide int16 values by 32768, or give the integer samples themselves)")
    if peak < SILENT_PEAK:
        raise AudioError(f"{name}: reference audio is silent")


def mono(wav: np.ndarray, axis: int, name: str) -> np.ndarray:
    """`wav`'s channels (along `axis`) averaged, as the official package mixes a reference down; AudioError where that
    is silent though a channel is not (a phase-inverted channel cancels the other: "silent" named no cause)."""
    mixed = wav.mean(axis=axis)
    if np.abs(mixed).max(initial=0) < SILENT_PEAK <= np.abs(wav).max(initial=0):
        raise AudioError(f"{name}: reference audio is silent once its {wav.shape[axis]} channels are averaged to mono: "
                         "they cancel (one is phase-inverted?); give one channel, or invert that one")
    return mixed


def _samples(pair: tuple, name: str) -> tuple[np.ndarray, int]:
    """A (samples, sample_rate) pair -> (mono float32 samples, rate); AudioError saying what is wrong.

    Samples are mono, shape (n,), or (n, channels) as soundfile reads them (averaged): a (channels, n) array,
    as librosa keeps them, would otherwise be taken as n channels of a few samples. Integer samples are PCM
    (`PCM`), scaled to [-1, 1): taken as they are, int16 speech would be thousands of times too loud.
    """
    if len(pair) != 2:
        raise AudioError(f"{name}: expected a (samples, sample_rate) pair, got a tuple of {len(pair)}")
    samples, sr = pair
    if isinstance(samples, numbers.Integral) and np.ndim(sr) > 0:  # scipy.io.wavfile.read's order, given as it came
        raise AudioError(f"{name}: got (sample_rate, samples), the order scipy.io.wavfile.read returns; give "
                         "(samples, sample_rate): rate, samples = wavfile.read(path); (samples, rate)")
    # A whole float rate (24000.0, as some libraries return it) is that rate; 22050.5 is no rate at all
    if isinstance(sr, numbers.Real) and not isinstance(sr, (bool, numbers.Integral)) and np.isfinite(sr) and sr > 0:
        if sr != int(sr):
            raise AudioError(f"{name}: sample rate {sr!r} is not a whole number of samples per second; give "
                             f"the file's rate as an integer (e.g. {round(sr)})")
        sr = int(sr)
    if isinstance(sr, bool) or not isinstance(sr, numbers.Integral) or sr <= 0:
        raise AudioError(f"{name}: sample rate must be a positive integer, got {sr!r}")
    try:
        wav = np.asarray(samples)
        if (native := wav.dtype.newbyteorder("=")) in PCM:  # big-endian int16 is PCM too
            offset, scale = PCM[native]
            wav = (wav.astype(np.float32) - offset) / np.float32(scale)
        elif wav.dtype.kind in "biu":
            raise AudioError(f"{name}: samples of dtype {wav.dtype} are not PCM audio; give float samples in "
                             f"[-1, 1], or int16, int32, int8 or uint8 PCM (as scipy.io.wavfile reads it)")
        elif wav.dtype.kind == "c":  # numpy would keep the real part with only a ComplexWarning
            raise AudioError(f"{name}: samples of dtype {wav.dtype} are complex; give real float samples in [-1, 1] "
                             "(a spectrum is not audio: take its inverse transform's real part yourself)")
        wav = np.asarray(wav, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise AudioError(f"{name}: samples must be an array of numbers ({exc})") from None
    if wav.ndim == 2 and wav.shape[1] > wav.shape[0]:
        raise AudioError(f"{name}: samples of shape {wav.shape} look like (channels, n); give mono samples, "
                         f"shape (n,), or (n, channels): transpose them (samples.T)")
    if wav.ndim not in (1, 2):
        raise AudioError(f"{name}: samples of shape {wav.shape}; give mono samples, shape (n,), or (n, channels)")
    return (mono(wav, -1, name) if wav.ndim == 2 else wav), int(sr)


def write_audio(path: Path, samples: np.ndarray, sample_rate: int) -> None:
    """Write `samples` atomically: to a temporary name in the same folder, then rename."""
    import soundfile as sf

    folder = str(path).endswith(("/", os.sep))  # (a Path drops the slash that says so)
    path = user_path(path)
    # OSErrors as ever, naming `path` and what is wrong with it (not a temporary name, or "File exists" for
    # a parent that is a file); a folder first, whatever its suffix (not "unsupported audio format ''")
    if path.is_dir() or folder:
        what = "is a folder" if path.is_dir() else "is a folder's path (it ends in /)"
        raise IsADirectoryError(errno.EISDIR, f"{what}; give the audio file's name (e.g. a.wav) inside it", str(path))
    kind = path.suffix.lower().lstrip(".")
    if kind not in FORMATS:
        problem = (f"unsupported audio format {path.suffix!r}" if path.suffix
                   else f"{path.name!r} is a suffix alone (a hidden file's name)" if path.name.lower()[1:] in FORMATS
                   else "the file name has no suffix")
        raise ValueError(f"{path}: {problem}; use one of .{', .'.join(FORMATS)} (e.g. a.wav)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotADirectoryError(errno.ENOTDIR, "a folder on this path is a file", str(path)) from None
    if problem := rate_problem(sample_rate, kind):
        raise ValueError(f"{path}: {problem}; nothing was written")
    if problem := shape_problem(samples):
        raise ValueError(f"{path}: {problem}; nothing was written")
    if not np.isfinite(samples).all():  # soundfile writes NaN as full scale: noise no error would name
        raise ValueError(f"{path}: some samples are not numbers (NaN or infinity); nothing was written")
    with atomic_write(path) as tmp, os_errors(path):
        sf.write(tmp, samples, sample_rate, format=kind.upper(), subtype=FORMATS[kind])


def rate_problem(sample_rate: int, kind: str) -> str | None:
    """Why a `kind` file (wav, flac, ogg) cannot hold audio at `sample_rate`, or None (`MAX_RATES`)."""
    if sample_rate <= MAX_RATES[kind]:
        return None
    wav = "" if kind == "wav" else ", or save it as .wav"
    return (f"a sample rate of {sample_rate} Hz is past what .{kind} holds ({MAX_RATES[kind]:,} Hz at most); "
            f"resample the audio{wav}")


def shape_problem(samples) -> str | None:
    """Why samples to write are no (n,) or (n, channels) array, or None. soundfile takes a (channels, n) array, as
    librosa keeps them, as n channels and failed "Error opening '.a.wav.omnitts-...tmp': Format not recognised"."""
    shape = np.shape(samples)
    if len(shape) == 2 and shape[1] > shape[0]:
        return (f"samples of shape {shape} look like (channels, n); give mono samples, shape (n,), or (n, channels): "
                "transpose them (samples.T)")
    if len(shape) not in (1, 2):
        return f"samples of shape {shape}; give mono samples, shape (n,), or (n, channels)"
    return None


@contextmanager
def os_errors(path: Path):
    """Raise a failed system call met by libsndfile (a full disk, EIO, EROFS...) as the OSError it is.

    libsndfile reports a failed write as "System error." and drops the cause; cffi keeps the C `errno`
    of its calls, which says it. Other libsndfile errors pass unchanged.
    """
    import soundfile as sf

    try:
        yield
    except sf.LibsndfileError as exc:
        code = getattr(getattr(sf, "_ffi", None), "errno", None)
        if code in DISK_FULL or (code and getattr(exc, "code", None) == SF_ERR_SYSTEM):
            raise OSError(code, os.strerror(code), str(path)) from exc
        raise


class AudioSink:
    """An audio file written piece by piece as samples arrive, under a temporary name until `commit`.

    The temporary file (`.<name>.<random>.tmp`, in the target's folder) is created on the first
    `write`; `commit` renames it into place (an item with no samples gets an empty file) and
    `abort` deletes it, so the target never exists half-written. With `loudness` (LUFS) the samples
    are kept as float32 in the temporary file and normalized as a whole at `commit` (integrated
    loudness needs the whole signal), which reads the item back into memory once.
    """

    def __init__(self, path: Path, sample_rate: int, loudness: float | None = None):
        self.path = Path(path)
        self.kind = self.path.suffix.lower().lstrip(".")
        if self.kind not in FORMATS:
            raise ValueError(f"{path}: unsupported audio format {self.path.suffix!r}")
        self.sample_rate = sample_rate
        self.loudness = loudness
        self.samples = 0
        self.tmp: str | None = None
        self._file = None

    def write(self, samples: np.ndarray) -> None:
        """Append `samples`; a full disk raises OSError(ENOSPC) (the caller aborts the sink)."""
        import soundfile as sf

        with os_errors(self.path):
            if self._file is None:
                self.tmp = temp_name(self.path)
                kind = ("WAV", "FLOAT") if self.loudness is not None else (self.kind.upper(), FORMATS[self.kind])
                self._file = sf.SoundFile(self.tmp, "w", samplerate=self.sample_rate, channels=1, format=kind[0],
                                          subtype=kind[1])
            self._file.write(np.asarray(samples, dtype=np.float32))
        self.samples += len(samples)

    def commit(self) -> Path:
        """Put the finished file in place (atomic rename)."""
        import soundfile as sf

        if self._file is None:
            write_audio(self.path, np.zeros(0, dtype=np.float32), self.sample_rate)
            return self.path
        try:
            with os_errors(self.path):
                self._file.close()
            if self.loudness is not None:
                from .loudness import normalize_loudness

                samples, _ = sf.read(self.tmp, dtype="float32")
                write_audio(self.path, normalize_loudness(samples, self.sample_rate, self.loudness),
                            self.sample_rate)
                Path(self.tmp).unlink(missing_ok=True)
            else:
                os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Drop the partial file (idempotent). Never raises: it runs while another error (a full disk)
        is on its way out, and closing a file on a full disk may fail again."""
        try:
            with suppress(Exception):  # the file is deleted below either way
                if self._file is not None and not self._file.closed:
                    self._file.close()
        finally:
            if self.tmp is not None:
                Path(self.tmp).unlink(missing_ok=True)
