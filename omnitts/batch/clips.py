"""A manifest line's reference clip, read once per file version: why it cannot be used, and how many samples
synthesis will read of it (what validate counts its frames from).

The clip is checked as synthesis will check it (`io.audio.load_reference`): its header (length) and at most
`MAX_REFERENCE_SECONDS` of its samples (silent, NaN), with soundfile, through which librosa reads it too. It knows
nothing of manifests' fields (manifest.py) or checkpoints (checker.py counts the frames).
"""

from __future__ import annotations

from pathlib import Path

from ..io.versioned import per_version


def reference_length(path: Path) -> tuple[int, int, bool] | None:
    """(samples, sample rate, whether that is the whole clip) of in-context reference clip `path` as synthesis
    reads it (librosa.load reads through soundfile, as here), from the read the line's check made of it (no second
    one); None where the clip cannot be used. Not whole: the read stopped at MAX_REFERENCE_SECONDS."""
    try:
        return read_reference(str(path), True)[1]
    except OSError:  # gone since the line's check
        return None


@per_version()  # manifests often reuse one reference clip on many lines
def read_reference(path: str, icl: bool) -> tuple[str | None, tuple[int, int, bool] | None]:
    """(why clip `path` cannot be used, None), or (None, its `reference_length`)."""
    import soundfile as sf

    from ..errors import AudioError
    from ..io.audio import MAX_REFERENCE_SECONDS, MIN_REFERENCE_SECONDS, check_samples, mono

    try:
        info = sf.info(path)
    except Exception as exc:  # soundfile raises LibsndfileError, RuntimeError, ... for unreadable files
        return f"cannot read audio {path} ({str(exc).strip() or type(exc).__name__})", None
    if info.duration < MIN_REFERENCE_SECONDS:
        return f"{path} is {info.duration:.2f} s long; at least {MIN_REFERENCE_SECONDS} s is needed", None
    if icl and info.duration > MAX_REFERENCE_SECONDS:
        return (f"{path} is {info.duration:.1f} s long; in-context cloning takes at most {MAX_REFERENCE_SECONDS:g} s "
                "(trim the clip and its ref_text, or set x_vector_only)"), None
    limit = int(MAX_REFERENCE_SECONDS * info.samplerate)
    try:  # the samples synthesis uses (at most 30 s), checked as it checks them (silent, NaN)
        wav, _ = sf.read(path, frames=limit, dtype="float32", always_2d=True)
        check_samples(mono(wav, 1, path), path)
    except AudioError as exc:
        return str(exc), None
    except Exception as exc:  # noqa: BLE001 - as sf.info above: the file is what matters
        return f"cannot read audio {path} ({str(exc).strip() or type(exc).__name__})", None
    return None, (wav.shape[0], info.samplerate, wav.shape[0] < limit)
