"""Check that another Python's numpy / librosa / soundfile read, resample and filter audio as this one's do.

omnitts' audio path needs only three calls from them: `librosa.load` (native rate, mono by channel
average), `librosa.resample` to the codec's rate, and `librosa.filters.mel` for the speaker encoder.
numpy 2.5 and librosa 1.0 need Python 3.12, where no CPU torch lies on our machines' disk, so CI runs
these calls in a small venv of that Python (no torch) and compares them with the main environment's:

    python scripts/audio_stack_check.py --other .cache/ci-audio312/bin/python

Exit status 1 when any array differs by more than 1e-6 (they have been bitwise equal so far).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-6


def arrays(workdir: Path) -> dict[str, np.ndarray]:
    import librosa
    import soundfile as sf

    stereo = workdir / "stereo44k.wav"
    rng = np.random.default_rng(0)
    sf.write(stereo, (0.1 * rng.standard_normal((2 * 44100, 2))).astype(np.float32), 44100, subtype="FLOAT")
    out = {}
    for name, path in (("ref16k", ROOT / "recipes" / "examples" / "ref.wav"), ("stereo44k", stereo)):
        wav, sr = librosa.load(str(path), sr=None, mono=True)
        out[f"{name}.load"] = wav
        out[f"{name}.resample"] = librosa.resample(y=wav, orig_sr=sr, target_sr=24000)
    out["mel"] = librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0.0, fmax=12000.0)
    return out


def versions() -> dict[str, str]:
    from importlib import metadata

    return {"python": sys.version.split()[0], **{n: metadata.version(n) for n in ("numpy", "librosa", "soundfile")}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", help="the other Python interpreter")
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)  # what --other runs
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        mine = arrays(Path(tmp))
        if args.dump:
            np.savez(args.dump, **mine)
            print(json.dumps(versions()))
            return 0
        if not args.other:
            parser.error("--other is required")
        dump = Path(tmp) / "other.npz"
        done = subprocess.run([args.other, __file__, "--dump", str(dump)], capture_output=True, text=True, check=True)
        theirs = dict(np.load(dump))
    print(f"audio stack: {versions()} vs {json.loads(done.stdout.strip().splitlines()[-1])}")
    bad = []
    for key, value in mine.items():
        other = theirs.get(key)
        same_shape = other is not None and other.shape == value.shape
        worst = float(np.abs(value.astype(np.float64) - other).max()) if same_shape else float("inf")
        print(f"  {key}: {'bitwise equal' if same_shape and np.array_equal(value, other) else f'max difference {worst:.3g}'}")
        if worst > TOLERANCE:
            bad.append(key)
    if bad:
        print(f"audio stack: {', '.join(bad)} differ by more than {TOLERANCE}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
