"""Does a line give the same codes and samples whoever runs beside it? One command, for a GPU lease.

    python scripts/check_deterministic.py --device cuda            # 0.6B shapes, bfloat16, 32 lines
    python scripts/check_deterministic.py                          # the CPU: tiny shapes, float32

Writes a manifest of LINES lines (each with its own seed and a 1-4 s budget; random weights never say EOS,
so the budget is the length), then runs `omnitts synth` twice per mode on the same checkpoint: once on the
manifest, once on the same lines in reverse order with as many other lines of other lengths between them
(other batch mates, other slots, another span bucket, another run size). Compares each shared line's
codes (ID.codes.npy) and samples (ID.wav) between the two runs, with `--deterministic` and without, and
prints how many lines agree bitwise. Exit 1 when a `--deterministic` line differs (the promise of
docs/determinism.md is broken); differences without it are reported, not failed (CUDA does not promise
them away).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("the quick brown fox jumps over a lazy dog while seven bakers sell fresh bread at the morning market "
         "near an old stone bridge").split()


def lines(n: int, prefix: str, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"{prefix}{i}", "text": " ".join(rng.choices(WORDS, k=rng.randint(4, 14))).capitalize() + ".",
             "language": "english", "speaker": "ryan", "seed": rng.randrange(2**31),
             "max_seconds": round(rng.uniform(1.0, 4.0), 2)} for i in range(n)]


def synth(manifest: Path, ckpt: Path, out: Path, args, deterministic: bool) -> float:
    command = [sys.executable, "-m", "omnitts", "synth", str(manifest), "-m", str(ckpt), "-o", str(out),
               "--device", args.device, "--dtype", args.dtype, "--max-batch", str(args.max_batch), "--save-codes",
               "-q", *(["--deterministic"] if deterministic else [])]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"omnitts synth failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def compare(first: Path, second: Path, ids: list[str]) -> tuple[int, int, list[str]]:
    """(lines with equal codes, lines with equal samples, ids that differ)."""
    import soundfile as sf

    codes = samples = 0
    differ = []
    for name in ids:
        a, b = np.load(first / f"{name}.codes.npy"), np.load(second / f"{name}.codes.npy")
        same_codes = a.shape == b.shape and np.array_equal(a, b)
        wa, _ = sf.read(first / f"{name}.wav", dtype="int16")
        wb, _ = sf.read(second / f"{name}.wav", dtype="int16")
        same_samples = wa.shape == wb.shape and np.array_equal(wa, wb)
        codes += same_codes
        samples += same_samples
        if not (same_codes and same_samples):
            differ.append(name)
    return codes, samples, differ


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--preset", help="checkpoint shape (default: 0.6b on cuda, tiny-0.6b on the cpu)")
    parser.add_argument("--dtype", help="default: bfloat16 on cuda, float32 on the cpu")
    parser.add_argument("--lines", type=int, help="lines compared (default: 32 on cuda, 6 on the cpu)")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--modes", default="deterministic,default", help="comma list of deterministic, default")
    parser.add_argument("--work", type=Path, help="keep the checkpoint, manifests and outputs here")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    args.preset = args.preset or ("0.6b" if cuda else "tiny-0.6b")
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    count = args.lines or (32 if cuda else 6)
    sys.path.insert(0, str(ROOT))
    from omnitts.testing.checkpoint import build_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ckpt = build_checkpoint(work / f"ckpt-{args.preset}", kind="custom_voice", preset=args.preset)
        shared, others = lines(count, "line", 1), lines(count, "other", 2)
        mixed = [row for pair in zip(reversed(shared), others) for row in pair]  # reversed, a stranger between
        plain, mixed_path = work / "lines.jsonl", work / "mixed.jsonl"
        plain.write_text("".join(json.dumps(r) + "\n" for r in shared))
        mixed_path.write_text("".join(json.dumps(r) + "\n" for r in mixed))
        print(f"{args.device} {args.dtype} {args.preset}, max batch {args.max_batch}: {count} lines alone, then "
              f"reversed with {count} others between them")
        failed = False
        for mode in args.modes.split(","):
            deterministic = mode == "deterministic"
            seconds = [synth(plain, ckpt, work / f"{mode}-a", args, deterministic),
                       synth(mixed_path, ckpt, work / f"{mode}-b", args, deterministic)]
            codes, samples, differ = compare(work / f"{mode}-a", work / f"{mode}-b", [r["id"] for r in shared])
            print(f"{mode:>13}: {codes}/{count} lines with the same codes, {samples}/{count} with the same samples "
                  f"(runs {seconds[0]:.1f} s, {seconds[1]:.1f} s){'; differ: ' + ', '.join(differ) if differ else ''}")
            failed |= deterministic and bool(differ)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
