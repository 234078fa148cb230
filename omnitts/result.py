"""What synthesis returns: `Audio`, the samples of one utterance plus what produced them.

An `Audio` saves itself atomically in the format its suffix names and plays inline in Jupyter
(`_repr_html_` embeds a 16-bit WAV as an HTML5 <audio> element; no IPython needed), and is its samples to
numpy (`np.asarray(audio)`). It does not
know how it was made; tts.py fills it in.
"""

from __future__ import annotations

import base64
import html
import io
import numbers
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import type_label
from .io import user_path
from .io.audio import rate_problem, shape_problem, write_audio


@dataclass(eq=False)  # samples are arrays: compare them explicitly
class Audio:
    """One synthesized utterance.

    Attributes:
        samples: float32 mono samples in [-1, 1], shape (n,); None where they streamed to a file and were not
            kept (a manifest run's results).
        sample_rate: samples per second (24000 for every Qwen3-TTS-12Hz checkpoint).
        codes: the generated codec codes, int64 of shape (frames, 16); None if not kept.
        finish_reason: "eos" (the model ended the utterance) or "length" (the frame budget ran out).
        id: the request's id (a manifest id, or "0", "1", ... for a list given to `synthesize`).
        seed: the seed the request sampled with: the one given, or for a request given none that samples,
            the one drawn for it (pass it back as `seed` to reproduce the audio). A greedy request keeps
            the seed it was given (unused: greedy decoding draws nothing), else None.
        talker_margin, predictor_margin: smallest greedy top-1/top-2 logit gaps (reference path only).

    Raises:
        TypeError, ValueError: `samples` that are one number or no array, or a `sample_rate` that is not a
            positive integer (one built by hand), named.
    """

    samples: np.ndarray
    sample_rate: int
    codes: np.ndarray | None = None
    finish_reason: str | None = None
    id: str | None = None
    seed: int | None = None
    talker_margin: float | None = None
    predictor_margin: float | None = None

    def __post_init__(self):
        # Checked once here: a rate of 0 made `duration` (and so repr, and a notebook's display) a ZeroDivisionError,
        # as samples of one number made it a TypeError ("object of type 'float' has no len()"). None: the samples
        # streamed to their file and were not kept (what a manifest run's results hold)
        if self.samples is not None and (not hasattr(self.samples, "__len__") or np.ndim(self.samples) == 0):
            kind = type_label(type(self.samples))
            given = f"one number ({kind})" if isinstance(self.samples, (numbers.Number, np.ndarray, np.generic)) else kind
            raise TypeError(f"samples: expected an array of samples, shape (n,), got {given}")
        rate = self.sample_rate
        if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, (int, np.integer)):
            raise TypeError(f"sample_rate: expected an int (samples per second), got {type_label(type(rate))}")
        if rate <= 0:
            raise ValueError(f"sample_rate: must be > 0 (samples per second), got {rate}")
        self.sample_rate = int(rate)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The samples, for numpy and what takes arrays: `np.asarray(audio)`, `sf.write(path, audio, rate)`
        (numpy 2's protocol: `copy` None copies only where `dtype` needs it, False never; numpy 1 passes no
        `copy`, and its `np.array` takes no None)."""
        if copy is False and dtype is not None and np.dtype(dtype) != self.samples.dtype:
            raise ValueError(f"Audio: its {self.samples.dtype} samples cannot be {np.dtype(dtype)} without a copy")
        return np.array(self.samples, dtype=dtype, copy=True) if copy else np.asarray(self.samples, dtype=dtype)

    @property
    def audio(self) -> np.ndarray:
        """The samples (the name `Result` used; kept for older code)."""
        return self.samples

    @property
    def frames(self) -> int:
        """Codec frames generated (80 ms each); 0 if the codes were not kept."""
        return 0 if self.codes is None else int(self.codes.shape[0])

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return len(self.samples) / self.sample_rate

    def save(self, path) -> Path:
        """Write the audio to `path`, atomically (a temporary name, then a rename).

        The format comes from the suffix: .wav and .flac (16-bit PCM) or .ogg (Vorbis). Missing
        folders are created; `~` is the home folder. Returns the path. Audio of no samples saves as .wav or .ogg;
        .flac refuses it (ValueError): libsndfile writes an empty FLAC as a 0-byte file nothing can read. A rate the
        format cannot hold (.ogg past 200 kHz, .flac past 655,350 Hz) is refused too (ValueError).
        """
        given, path = path, user_path(path)
        if path.suffix.lower() == ".flac" and np.size(self.samples) == 0 and not path.is_dir():
            raise ValueError(f"{path}: the audio has no samples, and an empty FLAC file cannot be read back "
                             "(libsndfile writes 0 bytes); save it as .wav or .ogg; nothing was written")
        write_audio(given, self.samples, self.sample_rate)  # as given: a folder's path ends in "/", a Path's not
        return path

    def to_wav_bytes(self) -> bytes:
        """The audio as an in-memory 16-bit PCM WAV file.

        Raises:
            ValueError: some samples are NaN or infinite, as `save` refuses them (soundfile writes them as
                full-scale noise), or are not of shape (n,) or (n, channels), or the rate is past what a WAV
                header holds (as `save` refuses it; soundfile raised OverflowError)."""
        import soundfile as sf

        if self.samples is None:
            raise ValueError("samples: not kept (they streamed to their file); no WAV was made")
        if problem := shape_problem(self.samples):
            raise ValueError(f"{problem}; no WAV was made")
        if problem := rate_problem(self.sample_rate, "wav"):
            raise ValueError(f"{problem}; no WAV was made")
        if not np.isfinite(self.samples).all():
            raise ValueError("samples: some are not numbers (NaN or infinity); no WAV was made")
        buffer = io.BytesIO()
        sf.write(buffer, self.samples, self.sample_rate, format="WAV", subtype="PCM_16")
        return buffer.getvalue()

    def _repr_html_(self) -> str:
        """Jupyter's rich display: a caption and an <audio> player with the WAV inline (base64); no player for
        samples that are not numbers (it would play full-scale noise)."""
        caption = html.escape(repr(self))
        try:
            data = base64.b64encode(self.to_wav_bytes()).decode("ascii")
        except ValueError as exc:
            return f"<div><code>{caption}</code><br>{html.escape(str(exc))}</div>"
        return (f"<div><code>{caption}</code><br>"
                f'<audio controls preload="none" src="data:audio/wav;base64,{data}"></audio></div>')

    def __repr__(self) -> str:
        parts = [f"id={self.id!r}"] if self.id is not None else []
        parts.append(f"samples not kept @ {self.sample_rate} Hz" if self.samples is None
                     else f"{self.duration:.2f} s @ {self.sample_rate} Hz")
        if self.codes is not None:
            parts.append(f"{self.frames} frames")
        if self.finish_reason:
            parts.append(f"finish={self.finish_reason}")
        if self.seed is not None:
            parts.append(f"seed={self.seed}")
        return f"Audio({', '.join(parts)})"


Result = Audio  # the name of this class before the notebook API; kept so older code keeps working
