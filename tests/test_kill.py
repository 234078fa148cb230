"""Interrupting `omnitts synth` (SIGINT, then SIGKILL) at random points loses and duplicates nothing."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import soundfile as sf

ITEMS = 56


def _start(manifest, ckpt, out):
    cmd = [sys.executable, "-m", "omnitts", "synth", str(manifest), "-m", str(ckpt), "-o", str(out),
           "--greedy", "--max-frames", "6", "--max-batch", "4", "--dtype", "float32", "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _lines(out):
    path = out / "results.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def _wait_for_lines(proc, out, count, timeout=120):
    deadline = time.time() + timeout
    while len(_lines(out)) < count and proc.poll() is None:
        assert time.time() < deadline, "synth made no progress"
        time.sleep(0.05)


def test_sigint_then_sigkill_then_resume(ckpt_dir, tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    rows = [{"id": f"item-{i:03d}", "text": f"Sentence number {i} of the kill test.", "speaker": "ryan"}
            for i in range(ITEMS)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "out"

    # 1. Ctrl-C part-way: running items finish, nothing new starts, the exit code says "interrupted".
    proc = _start(manifest, ckpt, out)
    _wait_for_lines(proc, out, rng.randint(1, ITEMS // 3))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (seed, err)
    assert "run the same command again to resume" in err, (seed, err)
    after_int = len(_lines(out))
    assert after_int < ITEMS, seed

    # 2. SIGKILL part-way: no chance to clean up at all.
    proc = _start(manifest, ckpt, out)
    _wait_for_lines(proc, out, after_int + rng.randint(1, 8))
    time.sleep(rng.random() * 0.3)  # land anywhere: mid-step, mid-write, mid-rename
    proc.kill()
    proc.wait(timeout=30)

    # 3. Resume to the end.
    proc = _start(manifest, ckpt, out)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, (seed, err)

    records = [json.loads(line) for line in _lines(out)]
    counts = Counter(r["id"] for r in records)
    assert set(counts) == {r["id"] for r in rows} and set(counts.values()) == {1}, (seed, counts)
    assert all(r["status"] == "ok" for r in records), seed
    expected = {f"{r['id']}.wav" for r in rows} | {"results.jsonl"}
    assert {p.name for p in out.iterdir()} == expected, seed  # no temporary or stray files
    for r in rows:
        info = sf.info(out / f"{r['id']}.wav")
        assert info.samplerate == 24000 and info.frames == 6 * 1920, (seed, r["id"])
