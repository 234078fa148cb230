"""`omnitts demo`: a tiny random checkpoint built on the spot and a small manifest synthesized with it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import OmniTTSError
from .options import INPUT, OUTPUT, Force, fail, option, path, user_path

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


def demo(
    model_dir: Annotated[Optional[Path], option("--model-dir", callback=user_path, parser=path, panel=INPUT, metavar="DIR",
                                                 help="Where the checkpoint is built. [default: "
                                                      ".cache/demo-tiny-customvoice, .cache/demo-tiny-voicedesign, "
                                                      ".cache/demo-tiny-base]")] = None,
    kind: Annotated[str, option("--kind", panel=INPUT, metavar="KIND", show_default=True,
                                 help="custom_voice, voice_design or base.")] = "custom_voice",
    out: Annotated[Optional[Path], option("--out", "-o", callback=user_path, parser=path, panel=OUTPUT, metavar="DIR",
                                           help="Output directory. [default: out/demo-KIND]")] = None,
    force: Force = False,
):
    """Build a tiny random checkpoint and synthesize a small manifest with it.

    The weights are random, so the audio is noise-like; the run shows the whole pipeline working.
    Each kind writes to its own folder: out/demo-custom_voice, out/demo-voice_design, out/demo-base.
    """
    import json

    from ..batch.outdir import check_out
    from . import synth  # (looked up at the call: a test may replace it)
    from ..config import load_config
    from ..io.atomic import atomic_write

    if kind not in DEMO_LINES:
        fail(f"--kind {kind!r}: choose {', '.join(DEMO_LINES)}")
    model_dir = model_dir or Path(f".cache/demo-tiny-{kind.replace('_', '')}")
    out = out or Path(f"out/demo-{kind}")
    built = all((model_dir / name).is_file() for name in ("model.safetensors", "speech_tokenizer/model.safetensors"))
    # The demo's own files in OUT: written where absent, kept where a demo run wrote them, and never written over
    # a file of the user's (an existing -o holding a demo.jsonl or ref.wav of its own)
    manifests = {name: "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode()
                 for name, lines in DEMO_LINES.items()}
    own = {out / "demo.jsonl": manifests[kind]}
    if kind == "base":
        own[out / "ref.wav"] = _demo_reference_wav()
    try:  # both checked before anything is built or written
        check_out(out)
        for target, data in own.items():
            if target.exists() and not (target.is_file() and (there := target.read_bytes()) == data):
                if target.name == "demo.jsonl" and (ran := [k for k, m in manifests.items() if m == there]):
                    fail(f"--out {out}: holds the {ran[0]} demo's run, not {kind}'s; pass --kind {ran[0]}, or "
                         "another -o")
                fail(f"--out {out}: holds a {target.name} that the demo did not write, and the demo writes its own "
                     "there; choose another -o (or move the file)")
        if not built:
            check_out(model_dir, "--model-dir")
        elif (built_kind := load_config(model_dir).model_type) != kind:  # its lines would fail on another kind
            fail(f"--model-dir {model_dir}: holds a {built_kind} checkpoint, not {kind}; pass --kind {built_kind}, "
                 "or another --model-dir to build one")
    except OmniTTSError as exc:
        fail(str(exc))
    if not built:
        if model_dir.is_dir() and any(model_dir.iterdir()):
            fail(f"--model-dir {model_dir}: not empty and not a demo checkpoint; the demo builds its checkpoint in "
                 "a new or empty folder (choose another --model-dir)")
        typer.echo(f"building tiny demo checkpoint in {model_dir}", err=True)
        _build_demo_checkpoint(model_dir, kind)
    out.mkdir(parents=True, exist_ok=True)
    for target, data in own.items():
        if not target.exists():
            with atomic_write(target) as tmp:
                Path(tmp).write_bytes(data)
    synth(manifest=out / "demo.jsonl", model=model_dir, out=out, greedy=True, max_frames=25, seed=0, dtype=None,
          codec_dtype=None, device=None, save_codes=True, official_tokenizer=False, quiet=False, max_batch=None,
          eager=None, deterministic=False, workers=None, devices=None, strict=False, retry_failed=False, force=force,
          audio_format="wav",
          retry_runaway=0,
          loudness=None, export_dataset=None, split_chars=None, column=None, id_column=None, text_column=None,
          recipe=None)


def _build_demo_checkpoint(model_dir: Path, kind: str) -> None:
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


def _demo_reference_wav() -> bytes:
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
