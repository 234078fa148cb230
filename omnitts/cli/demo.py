"""What `omnitts demo` builds and writes: its manifests, its reference clip, its tiny random checkpoint (the
command itself is in __init__.py, beside the synth it runs)."""

from __future__ import annotations

from pathlib import Path

# The demo's manifest for each kind
DEMO_LINES = {
    "custom_voice": [
        {"id": "hello", "text": "Hello from omnitts.", "language": "english", "speaker": "ryan"},
        {"id": "instruct", "text": "Speak slowly, please.", "language": "english", "speaker": "vivian", "instruct": "Calm and slow."},
        {"id": "dialect", "text": "你好，世界。", "language": "chinese", "speaker": "eric"},
    ],
    "voice_design": [
        {"id": "narrator", "text": "Once upon a time.", "language": "english", "instruct": "A warm, low male voice."},
        {"id": "bright", "text": "Good morning, everyone!", "language": "english", "instruct": "A bright, fast young voice."},
    ],
    "base": [
        {"id": "clone", "text": "Now in the cloned voice.", "language": "english", "ref_audio": "ref.wav",
         "ref_text": "This is the reference clip."},
        {"id": "xvector", "text": "Only the speaker embedding.", "language": "english", "ref_audio": "ref.wav",
         "x_vector_only": True},
    ],
}


def build_demo_checkpoint(model_dir: Path, kind: str) -> None:
    """Build into a folder beside `model_dir`, renamed into place when complete: an interrupted build leaves
    no half checkpoint (the next demo would refuse the folder) but a hidden folder the next build replaces."""
    import shutil

    from ..testing.checkpoint import build_checkpoint

    building = model_dir.parent / f".{model_dir.name}.building"
    shutil.rmtree(building, ignore_errors=True)
    build_checkpoint(building, kind=kind, preset="tiny-0.6b" if kind == "base" else "tiny-1.7b")
    if model_dir.is_dir():
        model_dir.rmdir()  # empty (checked)
    building.rename(model_dir)


def demo_reference_wav() -> bytes:
    """The bytes of a wav file: a 1.5 s voice-like reference clip (a gliding harmonic tone with a syllable rhythm),
    16 kHz."""
    import io

    import numpy as np
    import soundfile as sf

    from ..io.audio import FORMATS

    rate = 16000
    t = np.arange(int(rate * 1.5)) / rate
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.5 * (1 - np.cos(2 * np.pi * 4 * t)) * np.minimum(1, 10 * t) * np.minimum(1, 10 * (1.5 - t))
    wav = io.BytesIO()
    sf.write(wav, (0.25 * voice * envelope).astype(np.float32), rate, format="WAV", subtype=FORMATS["wav"])
    return wav.getvalue()
