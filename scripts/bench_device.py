"""Check and time the graph path on one device: graph-vs-eager codes, host syncs per frame, throughput.

    python scripts/bench_device.py --device cpu --preset tiny-0.6b          # the CPU fake, < 1 minute
    python scripts/bench_device.py --device cuda --preset 0.6b --json cuda.json
    python scripts/bench_device.py --device npu --preset 1.7b --official-python .cache/ref-venv/bin/python
    python scripts/bench_device.py --pipeline --device cuda --json pipeline.json   # whole synth: bench_pipeline.py
    python scripts/bench_device.py --count-ops --preset 0.6b                 # kernels per frame, seconds

Builds a random CustomVoice checkpoint (`omnitts.testing.checkpoint`; random weights never pick EOS,
so every request runs its whole budget), then
  1. runs the same greedy requests through graphs and eagerly and compares the codes;
  2. counts host syncs in steady-state steps (everything but `_collect`, the one allowed wait):
     CUDA and NPU with `torch.<device>.set_sync_debug_mode("error")` (torch_npu has it from 2.5; an
     older one is skipped with a message), CPU with the fake's `no_host_sync()`;
  3. times `--frames` frames for `--concurrency` requests at a time (bf16 on accelerators, float32
     on the CPU by default): engine steps per second and audio seconds per wall second;
  4. with `--official-python`, runs the official qwen-tts package on the same device and weights
     (scripts/reference_runner.py inside that venv), one request at a time.
On the CPU the "graphs" are the fake (omnitts/device/fake.py): the numbers check the bookkeeping,
not speed.

`--count-ops` does none of that: it counts the aten ops of one frame (batch `--concurrency`, default 8;
half the rows sampling, then all greedy) on the GPU path's CPU stand-in, without and with the fused ops
(omnitts/testing/opcount.py says what is counted and what is left out), at the preset's real layer
counts and tiny widths (`0.6b` counts `layers-0.6b`: the count does not depend on widths).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import omnitts  # noqa: E402
from omnitts.device import get_backend  # noqa: E402
from omnitts.engine import Engine, EngineConfig  # noqa: E402
from omnitts.request import Request  # noqa: E402
from omnitts.testing.checkpoint import build_checkpoint  # noqa: E402

FRAME_SECONDS = 1920 / 24000
SPEAKERS = ["ryan", "vivian", "serena", "aiden"]


def backend(device: str, eager: bool, checked: bool = True):
    if device == "cpu":
        from omnitts.device.fake import FakeGraphBackend

        return FakeGraphBackend(eager=eager, check_trace=checked)
    return get_backend(device, eager=eager)


def engine(tts, device: str, eager: bool, slots: int, positions: int, checked: bool = True) -> Engine:
    return Engine(tts.ckpt, EngineConfig(max_num_seqs=slots, max_positions=positions, device=device),
                  backend=backend(device, eager, checked))


def add_requests(tts, eng: Engine, count: int, frames: int) -> None:
    for i in range(count):
        request = Request(f"Request number {i} reads a short sentence aloud.", speaker=SPEAKERS[i % len(SPEAKERS)])
        eng.add(tts.prompts.build(request), tts.default_params(True, max_frames=frames), tag=i)


def codes(tts, eng: Engine, count: int, frames: int) -> list[np.ndarray]:
    add_requests(tts, eng, count, frames)
    done = {seq.tag: seq.codes() for seq in eng.run()}
    return [done[i] for i in range(count)]


def synchronize(device: str) -> None:
    if device != "cpu":
        getattr(torch, device).synchronize()


def count_syncs(tts, eng: Engine, device: str, steps: int) -> str:
    """Run `steps` steady-state steps with host syncs turned into errors outside `_collect`."""
    module = getattr(torch, device, None) if device != "cpu" else None
    if device != "cpu" and not hasattr(module, "set_sync_debug_mode"):
        return f"skipped: torch.{device} has no set_sync_debug_mode (torch_npu < 2.5); check a profile for host waits"
    add_requests(tts, eng, eng.config.max_num_seqs, steps + 4)
    for _ in range(2):  # admission and the first collect happen before the steady state
        eng.step()
    collect = eng._collect
    if device != "cpu":
        def waiting(pending):
            module.set_sync_debug_mode(0)
            try:
                return collect(pending)
            finally:
                module.set_sync_debug_mode("error")
        guard = _SyncErrors(module)
    else:
        from omnitts.device.fake import no_host_sync

        numpy = torch.Tensor.numpy

        def waiting(pending):
            with mock.patch.object(torch.Tensor, "numpy", numpy):
                return collect(pending)
        guard = no_host_sync()
    eng._collect = waiting
    try:
        with guard:
            for _ in range(steps):
                eng.step()
    except Exception as exc:  # a sync inside a step: report it, do not hide it
        return f"FAILED: {type(exc).__name__}: {exc}"
    finally:
        eng._collect = collect
    for _ in eng.run():
        pass
    return f"0 host syncs in {steps} steps (outside the one wait in _collect)"


class _SyncErrors:
    """Host syncs raise inside the block (`module`: torch.cuda or torch.npu)."""

    def __init__(self, module):
        self.module = module

    def __enter__(self):
        self.module.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        self.module.set_sync_debug_mode(0)


def throughput(tts, device: str, concurrency: int, frames: int, positions: int) -> dict:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    eng = engine(tts, device, False, concurrency, positions, checked=False)  # CPU: time the fake unchecked
    # Warm-up: the same requests once, untimed. Graphs are captured per (batch, span) bucket when a frame
    # first needs it, so a timed first pass would bill every bucket's warm-up and capture to the frames.
    add_requests(tts, eng, concurrency, frames)
    eng.run()
    capture = eng.graph_stats()["capture_seconds"]
    add_requests(tts, eng, concurrency, frames)
    synchronize(device)
    started, steps = time.perf_counter(), eng.steps_run
    produced = sum(len(seq.frames) for seq in eng.run())
    synchronize(device)
    wall = time.perf_counter() - started
    peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None
    return {"concurrency": concurrency, "capture_s": round(capture, 3), "peak_gib": peak,
            "steps": eng.steps_run - steps,
            "steps_per_s": round((eng.steps_run - steps) / wall, 2), "frames_per_s": round(produced / wall, 2),
            "audio_s_per_s": round(produced * FRAME_SECONDS / wall, 3), "wall_s": round(wall, 3)}


def official(python: Path, ckpt: Path, device: str, dtype: str, frames: int, work: Path) -> dict:
    """The official package, one request at a time (its cost is linear in frames: a shorter run is fair)."""
    spec, out = work / "official.json", work / "official"
    cases = [{"name": f"c{i}", "mode": "custom_voice", "text": f"Request number {i} reads a short sentence aloud.",
              "speaker": SPEAKERS[i % len(SPEAKERS)], "language": "auto", "max_new_tokens": frames + 1}
             for i in range(2)]
    spec.write_text(json.dumps({"checkpoint": str(ckpt), "dtype": dtype, "device": device, "cases": cases}))
    subprocess.run([str(python), str(ROOT / "scripts" / "reference_runner.py"), str(spec), str(out)], check=True)
    summary = json.loads((out / "summary.json").read_text())["cases"]
    produced = sum(summary[c["name"]]["frames"] for c in cases)
    wall = sum(summary[c["name"]]["wall_seconds"] for c in cases)
    return {"concurrency": 1, "frames_per_s": round(produced / wall, 2),
            "audio_s_per_s": round(produced * FRAME_SECONDS / wall, 3), "note": "includes codec decode"}


def count_ops(preset: str, batch: int, out: Path | None, device: str, dtype: str | None) -> int:
    """Print (and with `out`, write as JSON) one frame's op counts, unfused and fused, sampled and greedy;
    with `device` cuda also the kernels the profiler sees (`dtype`, default bfloat16; OMNITTS_FUSED 0 and 1)."""
    import os

    from omnitts.testing.opcount import count_cuda_kernels, count_frame

    preset = {"0.6b": "layers-0.6b", "1.7b": "layers-1.7b"}.get(preset, preset)
    report = {"preset": preset, "batch": batch, "counts": []}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_checkpoint(Path(tmp) / "ckpt", kind="custom_voice", preset=preset)
        for fused in (False, True):
            for sampled in (True, False):
                count = count_frame(ckpt, batch=batch, fused=fused, sampled=sampled)
                label = f"{'fused' if fused else 'unfused'}, {'half sampled' if sampled else 'greedy'}"
                print(f"{preset} {label}: {count.summary(12)}")
                report["counts"].append({"fused": fused, "sampled": sampled, "total": count.total,
                                         "non_view": count.kernels, "ops": dict(count.ops.most_common())})
        if device == "cuda":
            for fused in (False, True):
                with mock.patch.dict(os.environ, {"OMNITTS_FUSED": str(int(fused))}):
                    tts = omnitts.load(ckpt, device="cuda", dtype=dtype or "bfloat16", max_batch=batch)
                for sampled in (True, False):
                    count = count_cuda_kernels(tts, batch, sampled)
                    label = f"{'fused' if fused else 'unfused'}, {'half sampled' if sampled else 'greedy'}"
                    print(f"{preset} CUDA kernels, {label}: {count.summary(8)}")
                    report["counts"].append({"device": "cuda", "fused": fused, "sampled": sampled,
                                             "kernels": count.kernels, "by_name": dict(count.ops.most_common())})
    if out:
        out.write_text(json.dumps(report, indent=1))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--pipeline" in argv:  # the whole `omnitts synth` pipeline: scripts/bench_pipeline.py
        sys.path.insert(0, str(ROOT / "scripts"))
        import bench_pipeline

        return bench_pipeline.main([a for a in argv if a != "--pipeline"])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda", "npu"], default="cpu")
    parser.add_argument("--preset", default="0.6b", help="0.6b, 1.7b or tiny-0.6b (random weights)")
    parser.add_argument("--dtype", help="default: bfloat16 on cuda/npu, float32 on cpu")
    parser.add_argument("--concurrency", default=None, help="comma list (default 1,8,32,64; cpu: 1,4)")
    parser.add_argument("--frames", type=int, default=None, help="frames per request (default 128; cpu: 6)")
    parser.add_argument("--sync-steps", type=int, default=None, help="steady-state steps checked (default 8; cpu: 3)")
    parser.add_argument("--official-python", type=Path, help="python of a venv with qwen-tts (scripts/reference_env.py)")
    parser.add_argument("--official-frames", type=int, default=32, help="frames per official request (default 32)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--count-ops", action="store_true",
                        help="count one frame's aten ops (kernels on a GPU), unfused and fused, and stop")
    args = parser.parse_args(argv)
    if args.count_ops:
        return count_ops(args.preset, int((args.concurrency or "8").split(",")[0]), args.json, args.device, args.dtype)
    cpu = args.device == "cpu"
    dtype = args.dtype or ("float32" if cpu else "bfloat16")
    concurrency = [int(c) for c in (args.concurrency or ("1,4" if cpu else "1,8,32,64")).split(",")]
    frames = args.frames or (6 if cpu else 128)
    pairs = 2 if cpu else 4  # requests compared graph vs eager
    positions = -(-(200 + frames) // 256) * 256  # prompt + frames, in whole span buckets
    report = {"device": args.device, "preset": args.preset, "dtype": dtype, "frames": frames}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ckpt = build_checkpoint(work / "ckpt", kind="custom_voice", preset=args.preset)
        if args.device == "npu":
            from omnitts.device.npu import import_torch_npu

            import_torch_npu()
        tts = omnitts.load(ckpt, device=args.device, dtype=dtype)
        graphed = codes(tts, engine(tts, args.device, False, pairs, positions), pairs, frames)
        eager = codes(tts, engine(tts, args.device, True, pairs, positions), pairs, frames)
        same = [bool(np.array_equal(g, e)) for g, e in zip(graphed, eager)]
        report["graph_equals_eager"] = all(same)
        print(f"graph vs eager codes ({dtype}, {pairs} greedy requests x {frames} frames): "
              f"{'identical' if all(same) else f'DIFFER in requests {[i for i, s in enumerate(same) if not s]}'}")
        report["host_syncs"] = count_syncs(tts, engine(tts, args.device, False, pairs, positions), args.device,
                                           args.sync_steps or (3 if cpu else 8))
        print(f"host syncs: {report['host_syncs']}")
        report["omnitts"] = []
        for c in concurrency:
            row = throughput(tts, args.device, c, frames, positions)
            report["omnitts"].append(row)
            print(f"omnitts  concurrency {c:3d}: {row['frames_per_s']:9.1f} frames/s  {row['steps_per_s']:7.1f} steps/s  "
                  f"{row['audio_s_per_s']:8.2f} audio s/s  (graphs captured in {row['capture_s']} s"
                  + (f"; peak {row['peak_gib']} GiB)" if row["peak_gib"] is not None else ")"))
        if args.official_python:
            report["official"] = official(args.official_python, ckpt, args.device, dtype, args.official_frames, work)
            row = report["official"]
            print(f"official concurrency   1: {row['frames_per_s']:9.1f} frames/s  "
                  f"{row['audio_s_per_s']:8.2f} audio s/s  ({row['note']})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if report["graph_equals_eager"] and not report["host_syncs"].startswith("FAILED") else 1


if __name__ == "__main__":
    sys.exit(main())
