"""Scaling benchmark: one `omnitts synth` process against two writers, two shards, `--workers 2` and Ray with
two actors, on the same manifest, on this machine, in one run.

Every mode synthesizes the same manifest (greedy, a random CustomVoice checkpoint of --preset shapes with its
EOS row zeroed, so every item runs to its frame budget and every mode does the same work) into a fresh
output directory, as child processes timed from start to exit:

  one        `omnitts synth M -m CKPT -o OUT ...`                         (torch's default threads: all cores)
  writers    two such processes started together on one OUT            (claims share the work; 1 thread each)
  shards     two processes with --shard 0/2 and --shard 1/2           (1 thread each)
  workers    `omnitts synth ... --workers 2`                            (one command, two engine processes)
  ray        `omnitts synth ... --ray --workers 2`                      (a local Ray cluster, two actors)

and checks that each left every id exactly once with the frames asked for. Then the coordination costs
of one output directory on the filesystem of --work (point --work at a shared filesystem to measure
that): a claim taken and released, a claim attempt on an item another writer holds, and a result line
appended (locked, written, fsynced) - what every item pays, whoever runs it. Reported per mode: wall seconds,
items/s, seconds of audio per second, and the efficiency against `one` (its throughput ratio; 1.0 = as fast
as one process using every core). The per-item overhead Ray adds is the slope of wall time over items of
`ray` minus that of `workers` (both run at --items and at --items-small items; the intercept difference is
Ray's fixed start-up cost). The machine (CPU model, flags, cores) and the load before and after are recorded.

    python scripts/bench_scale.py [--preset 0.6b] [--items 24] [--json out.json]
    python scripts/bench_scale.py --quick            # tiny shapes: checks the modes, measures nothing useful
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_lib as lib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("one", "writers", "shards", "workers", "ray")


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="0.6b", help="checkpoint shapes [0.6b; --quick: tiny-0.6b]")
    parser.add_argument("--items", type=int, default=24, help="manifest lines [24]")
    parser.add_argument("--items-small", type=int, default=8, help="the smaller manifest for the Ray fit [8]")
    parser.add_argument("--min-frames", type=int, default=12)
    parser.add_argument("--max-frames", type=int, default=36)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench-scale")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few items (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.items, args.items_small, args.min_frames, args.max_frames = "tiny-0.6b", 8, 4, 4, 8
    return args


def synth_cmd(manifest: Path, ckpt: Path, out: Path, args, *extra) -> list[str]:
    return [sys.executable, "-m", "omnitts", "synth", str(manifest), "-m", str(ckpt), "-o", str(out), "--greedy",
            "--max-batch", str(args.max_batch), "--dtype", args.dtype, "--quiet", *extra]


def env(threads: int | None) -> dict:
    e = lib.child_env()
    if threads:
        e["OMP_NUM_THREADS"] = str(threads)
    return e


def run_mode(mode: str, manifest: Path, ckpt: Path, out: Path, args) -> float:
    """Run one mode into a fresh `out`; its wall seconds (start of the first process to exit of the last)."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    plans = {
        "one": [([], None)],
        "writers": [([], 1), ([], 1)],
        "shards": [(["--shard", "0/2"], 1), (["--shard", "1/2"], 1)],
        "workers": [(["--workers", "2"], None)],
        "ray": [(["--ray", "--workers", "2"], None)],
    }[mode]
    started = time.perf_counter()
    procs = [subprocess.Popen(synth_cmd(manifest, ckpt, out, args, *extra), env=env(threads), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for extra, threads in plans]
    outputs = [p.communicate() for p in procs]
    wall = time.perf_counter() - started
    for p, (_, err) in zip(procs, outputs):
        if p.returncode != 0:
            raise RuntimeError(f"{mode}: exit {p.returncode}\n{err[-3000:]}")
    return wall


def check(out: Path, items: list[dict]) -> None:
    """Every id exactly once, good, with the frames asked for; nothing but results and audio left."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    counts = Counter(r["id"] for r in rows)
    want = {it["id"]: it["frames"] for it in items}
    if counts != Counter(want.keys()) or any(r["status"] != "ok" or r["frames"] != want[r["id"]] for r in rows):
        raise RuntimeError(f"{out}: not every id exactly once with its frames: {counts}")
    stray = [p.name for p in out.iterdir() if p.name != "results.jsonl" and not p.name.endswith(".wav")]
    if stray:
        raise RuntimeError(f"{out}: left behind {stray}")


def main(argv=None) -> int:
    args = parse(argv)
    from omnitts.testing.checkpoint import build_checkpoint

    modes = [m for m in args.modes.split(",") if m]
    args.work.mkdir(parents=True, exist_ok=True)
    ckpt = args.work / f"custom_voice-{args.preset}"
    if not (ckpt / "config.json").exists():
        lib.say(f"building a random {args.preset} CustomVoice checkpoint in {ckpt}")
        build_checkpoint(ckpt, kind="custom_voice", preset=args.preset, dtype="bfloat16", eos_scale=0.0)
    lib.warm_page_cache(ckpt)
    results = {"machine": lib.cpu_info(), "load_before": lib.uptime(), "preset": args.preset,
               "dtype": args.dtype, "max_batch": args.max_batch, "modes": {}}
    sizes = {args.items}
    if {"ray", "workers"} <= set(modes):
        sizes.add(args.items_small)
    for n in sorted(sizes):
        items = lib.manifest_items(n, args.min_frames, args.max_frames)
        manifest = args.work / f"manifest-{n}.jsonl"
        lib.write_manifest(items, manifest)
        seconds = sum(it["frames"] for it in items) / 12.5
        for mode in modes:
            if n != args.items and mode not in ("ray", "workers"):
                continue
            lib.say(f"{mode}: {n} items")
            out = args.work / f"out-{mode}-{n}"
            try:
                wall = run_mode(mode, manifest, ckpt, out, args)
                check(out, items)
            except RuntimeError as exc:
                lib.say(f"{mode} failed: {str(exc)[:500]}")
                results["modes"].setdefault(mode, {})[str(n)] = {"error": str(exc)[:2000]}
                continue
            results["modes"].setdefault(mode, {})[str(n)] = {"wall": wall, "items_per_s": n / wall,
                                                             "audio_per_s": seconds / wall}
    results["coordination"] = coordination_costs(args.work / "coordination")
    results["load_after"] = lib.uptime()
    print(report(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def coordination_costs(folder: Path, n: int = 400) -> dict:
    """Median microseconds of a claim + release, a claim attempt that finds the item held, and a result
    line appended (lock, write, fsync), over `n` tries each, in a fresh `folder`."""
    import shutil
    import statistics

    from omnitts.batch.claims import Writer
    from omnitts.batch.ledger import Ledger

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    mine, other, ledger = Writer(folder), Writer(folder), Ledger(folder)

    def timed(fn) -> float:
        times = []
        for i in range(n):
            t = time.perf_counter()
            fn(i)
            times.append(time.perf_counter() - t)
        return 1e6 * statistics.median(times)

    try:
        claim = timed(lambda i: (mine.claim(f"c{i}"), mine.release(f"c{i}")))
        other.claim("held")
        refused = timed(lambda i: mine.claim("held"))
        record = {"status": "ok", "path": "x.wav", "seconds": 1.0, "samples": 24000, "frames": 13,
                  "finish_reason": "length", "seed": 1, "fingerprint": "0" * 64}
        append = timed(lambda i: ledger.write({"id": f"r{i}", **record}))
    finally:
        mine.close()
        other.close()
    shutil.rmtree(folder, ignore_errors=True)
    return {"claim_release_us": claim, "claim_refused_us": refused, "append_us": append}


def report(results: dict, args) -> str:
    m = results["machine"]
    lines = [f"machine: {m['model']} ({m['logical_cpus']} logical CPUs; {' '.join(m['flags'])}), torch {m['torch']}",
             f"load before: {results['load_before']}", f"load after:  {results['load_after']}",
             f"workload: {args.items} items of {args.min_frames}-{args.max_frames} frames, {results['preset']} shapes, "
             f"greedy, {results['dtype']}, --max-batch {results['max_batch']}", ""]
    n = str(args.items)
    base = results["modes"].get("one", {}).get(n, {}).get("items_per_s")
    rows = []
    for mode, runs in results["modes"].items():
        r = runs.get(n, {})
        if "error" in r:
            rows.append([mode, "failed", "-", "-", "-"])
        elif r:
            eff = f"{r['items_per_s'] / base:.2f}" if base else "-"
            rows.append([mode, f"{r['wall']:.1f}", f"{r['items_per_s']:.3f}", f"{r['audio_per_s']:.2f}", eff])
    lines.append(lib.table(["mode", "wall s", "items/s", "audio s/s", "vs one"], rows))
    fits = {}
    for mode in ("workers", "ray"):
        runs = results["modes"].get(mode, {})
        points = [(int(k), v["wall"]) for k, v in runs.items() if "wall" in v]
        if len(points) == 2:
            fits[mode] = lib.fit_line(points)  # (intercept, slope)
    if len(fits) == 2:
        (a_w, b_w), (a_r, b_r) = fits["workers"], fits["ray"]
        lines.append(f"\nper item: workers {b_w:.3f} s, ray {b_r:.3f} s -> Ray adds {b_r - b_w:+.3f} s per item; "
                     f"fixed: workers {a_w:.1f} s, ray {a_r:.1f} s -> Ray adds {a_r - a_w:+.1f} s at start")
    c = results.get("coordination")
    if c:
        lines.append(f"\ncoordination on {args.work} ({_fs(args.work)}): claim + release {c['claim_release_us']:.0f} us, "
                     f"claim refused {c['claim_refused_us']:.0f} us, result line appended (fsync) "
                     f"{c['append_us']:.0f} us (medians)")
    return "\n".join(lines)


def _fs(path: Path) -> str:
    """The filesystem type `path` lies on (from /proc/mounts; '?' elsewhere)."""
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, fstype = line.split()[:3]
            if str(path.resolve()).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    except OSError:
        pass
    return kind


if __name__ == "__main__":
    sys.exit(main())
