"""Peak memory of `omnitts synth` as the manifest grows and as items get longer (tiny checkpoint).

Each run is a fresh `python -m omnitts synth` subprocess; its peak resident set comes from
`os.wait4` (the kernel's ru_maxrss for that child alone), and its resident set is also sampled from
/proc every 0.5 s, reported at a quarter, half, three quarters and the end of the run's wall time,
so the table shows both the peak and how it moves (it should stay flat).

    python scripts/memory.py [--lines 1000,10000] [--lengths 20,600] [--json memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run(manifest: Path, ckpt: Path, out: Path, frames: int, max_batch: int) -> dict:
    cmd = [sys.executable, "-m", "omnitts", "synth", str(manifest), "-m", str(ckpt), "-o", str(out), "--greedy",
           "--max-frames", str(frames), "--max-batch", str(max_batch), "--quiet"]
    started = time.time()
    log = out.parent / f"{out.name}.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ))
    samples = []
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # reaps with this child's own rusage
        if pid:
            break
        ledger = out / "results.jsonl"
        done = sum(1 for _ in open(ledger)) if ledger.exists() else 0
        value = rss_mib(proc.pid)
        if value is not None:
            samples.append((done, value))
        time.sleep(0.5)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"synth failed ({code}): {log.read_text()[-2000:]}")
    peak = usage.ru_maxrss / 1024  # KiB on Linux
    # RSS at a quarter, half, three quarters and the end of the run's samples (flat = no growth over time)
    lines = sum(1 for _ in open(manifest))
    values = [v for _, v in samples]
    marks = {f"rss_at_{q}pct_mib": round(values[min(len(values) - 1, len(values) * q // 100)], 1) if values else None
             for q in (25, 50, 75, 100)}
    return {"lines": lines, "frames": frames, "peak_rss_mib": round(peak, 1), **marks,
            "wall_s": round(time.time() - started, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", default="1000,10000", help="manifest sizes (short items)")
    parser.add_argument("--short-frames", type=int, default=2)
    parser.add_argument("--lengths", default="20,600", help="frames per item of the item-length runs (600 = 48 s)")
    parser.add_argument("--long-items", type=int, default=64, help="items in each item-length run")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from omnitts.testing.checkpoint import build_checkpoint

    work = Path(tempfile.mkdtemp(prefix="omnitts-memory-"))
    ckpt = build_checkpoint(work / "ckpt", kind="custom_voice", preset="tiny-0.6b")
    results = []

    def manifest(name: str, count: int) -> Path:
        path = work / f"{name}.jsonl"
        with open(path, "w") as handle:
            for i in range(count):
                text = f"Line {i} of a long manifest, with a few words in it."
                handle.write(json.dumps({"id": f"{name}-{i:06d}", "text": text, "speaker": "ryan"}) + "\n")
        return path

    for lines in (int(x) for x in args.lines.split(",")):
        m = manifest(f"short{lines}", lines)
        results.append({"case": f"{lines} short items", **run(m, ckpt, work / f"out-short{lines}",
                                                               args.short_frames, args.max_batch)})
        print(json.dumps(results[-1]), flush=True)
    for frames in (int(x) for x in args.lengths.split(",")):
        m = manifest(f"len{frames}", args.long_items)
        results.append({"case": f"{args.long_items} items of {frames} frames",
                        **run(m, ckpt, work / f"out-len{frames}", frames, args.max_batch)})
        print(json.dumps(results[-1]), flush=True)
    print(f"\n{'case':28} {'peak MiB':>9} {'@25%':>7} {'@50%':>7} {'@75%':>7} {'@100%':>7} {'wall s':>7}")
    for r in results:
        print(f"{r['case']:28} {r['peak_rss_mib']:>9} {r['rss_at_25pct_mib']!s:>7} {r['rss_at_50pct_mib']!s:>7} "
              f"{r['rss_at_75pct_mib']!s:>7} {r['rss_at_100pct_mib']!s:>7} {r['wall_s']:>7}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
