"""Benchmark omnitts against the official qwen-tts 0.1.1 on the same weights and inputs, in one run.

Builds a random CustomVoice checkpoint with the real 0.6B shapes (or --preset), then measures, all
greedy, float32, on this machine's CPU:
  1. ms per frame at batch 1 (generation + codec decode), official vs omnitts;
  2. a manifest of --items lines with frame budgets spread over [--min-frames, --max-frames]:
     official one by one, official static batches of 8 (its API takes one budget per call, so a
     batch runs to its longest item), omnitts continuous batching at each --batches size;
     reported as audio seconds per wall second (only the requested frames count as audio);
  3. this CPU's float32 matmul throughput, and the fraction of it one omnitts frame step reaches.

    python scripts/bench.py [--items 64 --min-frames 20 --max-frames 200] [--json results.json]

Random weights never pick EOS here (the checkpoint's EOS row is zeroed), so every item runs to its
budget and both implementations do the same work. Needs the reference venv (scripts/reference_env.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
FRAME_SECONDS = 1920 / 24000
SPEAKERS = ["ryan", "vivian", "serena", "aiden"]
WORDS = ("the quick brown fox jumps over a lazy dog while seven bright stars shine above quiet "
         "rivers and distant mountains under a calm evening sky").split()


def texts(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(6, 16)))).capitalize() + "." for _ in range(n)]


def budgets(n: int, low: int, high: int) -> list[int]:
    values = np.linspace(low, high, n).round().astype(int)
    np.random.default_rng(1).shuffle(values)
    return [int(v) for v in values]


def matmul_gflops(size: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    started = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return 2 * size**3 * repeats / (time.perf_counter() - started) / 1e9


def frame_flops(tts, batch: int) -> float:
    """Matmul FLOPs of one frame step for `batch` rows (weights touched per row x 2), attention excluded."""
    talker = tts.ckpt.model.talker
    layers = sum(p.numel() for n, p in talker.model.layers.named_parameters() if p.dim() == 2)
    predictor = talker.code_predictor
    p_layers = sum(p.numel() for p in predictor.model.layers.parameters() if p.dim() == 2)
    groups = predictor.cfg.num_code_groups - 1
    per_row = layers + talker.codec_head.weight.numel() + groups * p_layers + 2 * p_layers \
        + sum(h.weight.numel() for h in predictor.lm_head)
    return 2.0 * per_row * batch


def run_official(python: Path, ckpt: Path, cases: list[dict], work: Path, name: str) -> dict:
    spec = work / f"{name}.json"
    out = work / f"official-{name}"
    spec.write_text(json.dumps({"checkpoint": str(ckpt), "dtype": "float32", "cases": cases}))
    subprocess.run([str(python), str(ROOT / "scripts" / "reference_runner.py"), str(spec), str(out)], check=True)
    summary = json.loads((out / "summary.json").read_text())["cases"]
    return {"wall": sum(summary[c["name"]]["wall_seconds"] for c in cases), "cases": summary}


def omnitts_wall(tts, jobs) -> float:
    started = time.perf_counter()
    for _ in tts.generate(jobs):
        pass
    return time.perf_counter() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("OMNITTS_REF_VENV", ROOT / ".cache" / "ref-venv")))
    parser.add_argument("--preset", default="0.6b")
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--min-frames", type=int, default=20)
    parser.add_argument("--max-frames", type=int, default=200)
    parser.add_argument("--single-frames", type=int, default=30, help="frames of the batch-1 measurement")
    parser.add_argument("--batches", default="8,16,32", help="omnitts max batch sizes to measure")
    parser.add_argument("--static-batch", type=int, default=8, help="the official static batch size")
    parser.add_argument("--skip-official-single", action="store_true", help="skip the (slow) one-by-one official run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    import omnitts
    from omnitts.request import Request
    from omnitts.testing.checkpoint import build_checkpoint

    python = args.venv / "bin" / "python"
    if not python.exists():
        sys.exit(f"reference venv not found at {args.venv}; run: python scripts/reference_env.py")
    args.work.mkdir(parents=True, exist_ok=True)
    ckpt = args.work / f"custom_voice-{args.preset}"
    if not (ckpt / "model.safetensors").exists():
        print(f"building a random {args.preset} CustomVoice checkpoint in {ckpt}", flush=True)
        build_checkpoint(ckpt, kind="custom_voice", preset=args.preset, dtype="bfloat16")
    results: dict = {"preset": args.preset, "threads": torch.get_num_threads(), "items": args.items,
                     "frames": [args.min_frames, args.max_frames]}
    results["matmul_gflops"] = matmul_gflops()

    # 1. batch 1
    text = texts(1)[0]
    single = {"name": "single", "mode": "custom_voice", "text": text, "language": "English", "speaker": "ryan",
              "max_new_tokens": args.single_frames + 1}
    official = run_official(python, ckpt, [single], args.work, "single")
    results["official_ms_per_frame"] = 1000 * official["wall"] / args.single_frames
    tts = omnitts.load(ckpt, max_batch=max(int(b) for b in args.batches.split(",")))
    job = (Request(text, "english", "ryan"), tts.default_params(True, max_frames=args.single_frames))
    omnitts_wall(tts, [job])  # warm-up
    results["omnitts_ms_per_frame"] = 1000 * omnitts_wall(tts, [job]) / args.single_frames
    results["batch1_ratio"] = results["omnitts_ms_per_frame"] / results["official_ms_per_frame"]
    step = frame_flops(tts, 1) / (results["omnitts_ms_per_frame"] / 1000) / 1e9
    results["batch1_gflops"], results["batch1_peak_fraction"] = step, step / results["matmul_gflops"]
    print(json.dumps(results, indent=1), flush=True)

    # 2. the manifest
    items = list(zip(texts(args.items), budgets(args.items, args.min_frames, args.max_frames)))
    audio_seconds = sum(frames for _, frames in items) * FRAME_SECONDS
    results["audio_seconds"] = audio_seconds
    cases = [{"name": f"item{i}", "mode": "custom_voice", "text": t, "language": "English",
              "speaker": SPEAKERS[i % len(SPEAKERS)], "max_new_tokens": f + 1} for i, (t, f) in enumerate(items)]
    if not args.skip_official_single:
        results["official_single_wall"] = run_official(python, ckpt, cases, args.work, "manifest-single")["wall"]
    static = []
    for start in range(0, len(items), args.static_batch):
        chunk = items[start:start + args.static_batch]
        static.append({"name": f"batch{start}", "mode": "custom_voice", "text": [t for t, _ in chunk],
                       "language": "English", "speaker": [SPEAKERS[(start + j) % len(SPEAKERS)] for j in range(len(chunk))],
                       "max_new_tokens": max(f for _, f in chunk) + 1})
    results["official_static_wall"] = run_official(python, ckpt, static, args.work, "manifest-static")["wall"]
    jobs = [(Request(t, "english", SPEAKERS[i % len(SPEAKERS)]), tts.default_params(True, max_frames=f))
            for i, (t, f) in enumerate(items)]
    for size in (int(b) for b in args.batches.split(",")):
        tts.max_batch = size
        results[f"omnitts_continuous_{size}_wall"] = omnitts_wall(tts, jobs)
        print(f"omnitts continuous max batch {size}: {results[f'omnitts_continuous_{size}_wall']:.1f} s", flush=True)
    for key in [k for k in results if k.endswith("_wall")]:
        results[key.replace("_wall", "_rtf")] = audio_seconds / results[key]  # audio seconds per wall second
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
