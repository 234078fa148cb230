"""What bfloat16 (and float16) language models, and a bfloat16 codec, cost in quality against float32.

For each test checkpoint and text, greedy codes and audio are generated in float32 and in each
other setting, given as LM_DTYPE or LM_DTYPE/CODEC_DTYPE (the codec runs in float32 unless the
setting names bfloat16 for it; float32/bfloat16 isolates the codec's own cost). Reported per setting:
  - codes agreement: share of frames whose 16 codes equal the float32 frame at the same index;
  - first divergence: frames generated before the first differing frame (autoregression then
    follows another path, so later frames differ by construction);
  - waveform SNR (dB) of the other setting's audio against the float32 audio over the whole clip.
    (With a float32 codec the audio is bitwise equal before the first divergence: the codec is causal.)

    python scripts/dtype_quality.py [--presets tiny-0.6b,tiny-1.7b] [--dtypes bfloat16,bfloat16/bfloat16]
                                    [--frames 48] [--texts 6]

Random weights stand in for real ones (none exist here): greedy margins are decisive by
construction (see omnitts.testing.checkpoint), so agreement on real checkpoints may differ.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

TEXTS = ["Hello there, and welcome to the show.", "The quick brown fox jumps over the lazy dog.",
         "Seven bright stars shine above quiet rivers.", "Numbers like 2024 and 3.14 are read aloud.",
         "A calm evening under distant mountains.", "Short line."]


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    n = min(len(reference), len(other))
    if n == 0:
        return float("nan")
    noise = np.sum((reference[:n] - other[:n]) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(reference[:n] ** 2) / noise))


def split_setting(setting: str) -> tuple[str, str]:
    """"bfloat16" -> ("bfloat16", "float32"); "bfloat16/bfloat16" -> LM dtype, codec dtype."""
    dtype, _, codec_dtype = setting.partition("/")
    return dtype, codec_dtype or "float32"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="tiny-0.6b,tiny-1.7b")
    parser.add_argument("--dtypes", default="bfloat16,float32/bfloat16,bfloat16/bfloat16",
                        help="settings to compare with float32: LM_DTYPE or LM_DTYPE/CODEC_DTYPE, comma-separated")
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--texts", type=int, default=len(TEXTS))
    args = parser.parse_args(argv)

    import omnitts
    from omnitts.testing.checkpoint import build_checkpoint

    print("| checkpoint | LM dtype | codec dtype | codes agreement | frames before first divergence (mean) | "
          "waveform SNR (dB, median) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            folder = build_checkpoint(Path(tmp) / preset, kind="custom_voice", preset=preset, dtype="bfloat16")
            runs = {}
            for setting in ["float32"] + args.dtypes.split(","):
                dtype, codec_dtype = split_setting(setting)
                tts = omnitts.load(folder, dtype=dtype, codec_dtype=codec_dtype)
                runs[setting] = [tts.synthesize(t, speaker="ryan", language="english", greedy=True,
                                                max_frames=args.frames)
                               for t in TEXTS[: args.texts]]
            for setting in args.dtypes.split(","):
                agree, first, whole = [], [], []
                for ref, other in zip(runs["float32"], runs[setting]):
                    n = min(ref.frames, other.frames)
                    same = (ref.codes[:n] == other.codes[:n]).all(axis=1)
                    agree.append(same.mean())
                    k = int(np.argmin(same)) if not same.all() else n
                    first.append(k)
                    whole.append(snr_db(ref.samples, other.samples))
                dtype, codec_dtype = split_setting(setting)
                print(f"| {preset} | {dtype} | {codec_dtype} | {100 * np.mean(agree):.1f}% | "
                      f"{np.mean(first):.1f} of {args.frames} | {np.median(whole):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
