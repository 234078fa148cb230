"""AMX tiles against the AVX512-BF16 kernel, on a CPU that has both: bfloat16 linears, prefill, engine steps.

    python scripts/bench_amx.py [--work .cache/bench-amx] [--batches 1,8,32] [--rounds 3] [--json out.json]

1. Linears (this process, torch's threads): ms per call of omnitts' bfloat16 linear on AMX (`amx=True`), on
   the VDPBF16PS tiles (`amx=False`) and torch's own (oneDNN) linear, at the 0.6B talker's shapes and 1 to
   128 rows; the three alternate, each the fastest of --reps rounds of 10 calls (so other load on the
   machine skews them alike), each over 8 copies of the weight (out of cache, as a model's are).
2. Engine (child processes, OMNITTS_AMX=1 and 0 alternating --rounds times, the fastest of each): a
   0.6B-shaped Base checkpoint (random weights, built once under --work), bfloat16; the prefill of one
   in-context clone's prompt (an 8 s reference and a sentence: ~110 positions) and steady engine steps
   (the fastest of 5) at each batch.
Prints the CPU (model, flags, torch) and the load average before and after: compare only runs on a quiet
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

SHAPES = [(1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024)]  # 0.6B talker: qkv, o, gate-up, down


def _calls(x, copies, weight) -> dict:
    """The three ways to compute `x` times each copy's weight, timed against each other."""
    return {"amx": lambda: [torch.ops.omnitts.linear(x, p.weight, p.out_features, None, True) for p in copies],
            "vdpbf16ps": lambda: [torch.ops.omnitts.linear(x, p.weight, p.out_features, None, False) for p in copies],
            "onednn": lambda: [torch.nn.functional.linear(x, weight) for _ in copies]}


def linears(reps: int) -> list[dict]:
    from omnitts.device.cpu_weights import PackedLinear

    rows = []
    for depth, width in SHAPES:
        linear = torch.nn.Linear(depth, width, bias=False).to(torch.bfloat16)
        copies = [PackedLinear(linear, torch.bfloat16) for _ in range(8)]
        weight = linear.weight.detach()
        for m in (1, 2, 8, 16, 32, 64, 128):
            x = torch.randn(m, depth).to(torch.bfloat16)
            calls = _calls(x, copies, weight)
            best = dict.fromkeys(calls, float("inf"))
            for call in calls.values():
                call()
            for _ in range(reps):
                for name, call in calls.items():
                    began = time.perf_counter()
                    call()
                    best[name] = min(best[name], (time.perf_counter() - began) / len(copies))
            row = {"in": depth, "out": width, "rows": m, **{f"{k}_ms": round(v * 1e3, 4) for k, v in best.items()}}
            rows.append(row)
            print(f"  {depth:5d} -> {width:5d}, {m:3d} rows: AMX {row['amx_ms']:.3f} ms, VDPBF16PS "
                  f"{row['vdpbf16ps_ms']:.3f} ms ({best['vdpbf16ps'] / best['amx']:.2f}x), oneDNN "
                  f"{row['onednn_ms']:.3f} ms ({best['onednn'] / best['amx']:.2f}x)", flush=True)
    return rows


CHILD = r"""
import json, sys, time, numpy as np, soundfile as sf, torch
import omnitts
from omnitts.engine import Engine, plan
from omnitts.request import Request
ckpt, work, batches = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3].split(",")]
t = np.arange(24000 * 8) / 24000
ref = f"{work}/ref.wav"
sf.write(ref, (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(t))).astype(np.float32), 24000)
tts = omnitts.load(ckpt, dtype="bfloat16", max_batch=max(batches))
voice = tts.clone_voice(ref, ref_text="This is an eight second reference clip spoken by someone calm and slow.")
prompts = [tts.prepare(Request(f"Sentence number {i} of the test, read in the cloned voice, not too long.",
                               "english", voice=voice, id=str(i))) for i in range(max(batches))]
params = tts.default_params(True, max_frames=30)
text = max(p.trailing.shape[0] for p in prompts) + 1
out = {"amx": bool(torch.ops.omnitts.amx()), "prompt_positions": int(prompts[0].embeds.shape[0])}
engine = Engine(tts.ckpt, plan(tts.ckpt, 400, 1, text, tts.kv_budget_bytes))
times = []
for _ in range(4):
    began = time.perf_counter(); engine.runner.prefill(0, [prompts[0].embeds]); times.append(time.perf_counter() - began)
out["prefill_ms"] = round(1e3 * min(times[1:]), 1)
for batch in batches:
    engine = Engine(tts.ckpt, plan(tts.ckpt, 400, batch, text, tts.kv_budget_bytes))
    for p in prompts[:batch]:
        engine.add(p, params)
    engine.step(); engine.step()
    times = []
    for _ in range(5):
        began = time.perf_counter(); engine.step(); times.append(time.perf_counter() - began)
    out[f"step_ms_batch_{batch}"] = round(1e3 * min(times), 1)
print("RESULT", json.dumps(out))
"""


def engine(work: Path, batches: str, rounds: int) -> dict:
    from omnitts.testing.checkpoint import build_checkpoint

    ckpt = work / "base-0.6b"
    if not (ckpt / "model.safetensors").exists():
        print(f"  building a 0.6B-shaped Base checkpoint in {ckpt} (once, about a minute)", flush=True)
        build_checkpoint(ckpt, kind="base", preset="0.6b")
    best: dict = {}
    for round_ in range(rounds):
        for amx in ("1", "0"):
            done = subprocess.run([sys.executable, "-c", CHILD, str(ckpt), str(work), batches], capture_output=True,
                                  text=True, env={**os.environ, "OMNITTS_AMX": amx}, timeout=1800, check=False)
            line = [row for row in done.stdout.splitlines() if row.startswith("RESULT ")]
            if done.returncode != 0 or not line:
                sys.exit(f"the engine child failed (OMNITTS_AMX={amx}):\n{done.stderr[-3000:]}")
            result = json.loads(line[0][7:])
            print(f"  round {round_ + 1}, OMNITTS_AMX={amx}: {result}", flush=True)
            mine = best.setdefault(amx, result)
            for key, value in result.items():
                if "_ms" in key:
                    mine[key] = min(mine[key], value)
    return best


def main() -> int:
    from bench_lib import cpu_info, uptime

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench-amx")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from omnitts.device import native

    if not native.available(torch.bfloat16) or not native.amx():
        print("this CPU (or build) has no AMX for omnitts' kernels: nothing to compare", file=sys.stderr)
        return 1
    args.work.mkdir(parents=True, exist_ok=True)
    report = {"cpu": cpu_info(), "load_before": uptime()}
    print(f"cpu: {report['cpu']}\n{report['load_before']}\nbfloat16 linears, ms per call (fastest of {args.reps}):")
    report["linears"] = linears(args.reps)
    print(f"engine, 0.6B shapes, bfloat16 (fastest of {args.rounds} rounds per setting):")
    report["engine"] = best = engine(args.work, args.batches, args.rounds)
    for key in sorted(k for k in best["1"] if "_ms" in k):
        print(f"  {key}: AMX {best['1'][key]} ms, VDPBF16PS {best['0'][key]} ms ({best['0'][key] / best['1'][key]:.2f}x)")
    report["load_after"] = uptime()
    print(report["load_after"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
