"""Many writers on one output directory: claims, the shared log, shards, and processes killed mid-run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import soundfile as sf

from omnitts.batch.claims import CLAIM, WRITER, ClaimError, Writer, live_writers, sweep
from omnitts.batch.ledger import Ledger, read_results, records
from omnitts.batch.shard import ShardError, in_shard, parse_shard, shard_of

ITEMS = 24


# -- claims -------------------------------------------------------------------------------------
def test_a_claim_excludes_every_other_writer_until_released(tmp_path):
    a, b = Writer(tmp_path), Writer(tmp_path)  # two writers of one process exclude each other as processes do
    assert a.claim("x") and a.claim("x")  # idempotent for its holder
    assert not b.claim("x")
    assert (tmp_path / f".x{CLAIM}").is_file()
    assert json.loads((tmp_path / f".x{CLAIM}").read_text())["pid"] == os.getpid()
    a.release("x")
    assert not (tmp_path / f".x{CLAIM}").exists()
    assert b.claim("x")
    b.release("x")
    a.close()
    b.close()
    assert os.listdir(tmp_path) == []  # the writer lock went with the last writer of the process


_HOLDER = """
import sys, time
from omnitts.batch.claims import Writer
w = Writer(sys.argv[1])
assert w.claim("x")
open(sys.argv[2], "w").close()
time.sleep(60)
"""


def _holder(out: Path, tmp_path: Path) -> subprocess.Popen:
    """A process that claims item x in `out` and sleeps (to be killed)."""
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out), str(ready)])
    deadline = time.time() + 60
    while not ready.exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.02)
    return proc


def test_a_killed_writers_claims_are_free_at_once_and_swept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = _holder(out, tmp_path)
    me = Writer(out)
    try:
        assert not me.claim("x")  # held by a live process
        assert len(live_writers(out)) == 2
        dead_tmp = next(iter(live_writers(out) - {me.token}))
        leftover = out / f".x.wav.omnitts-{dead_tmp}-abcdefgh.tmp"
        leftover.write_bytes(b"half")
        assert sweep(out) == 0 and leftover.exists()  # nothing of a live writer is touched
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert sweep(out) == 2  # its temporary file and its claim
        assert not leftover.exists() and not (out / f".x{CLAIM}").exists()
        assert live_writers(out) == {me.token}
        assert [p.name for p in out.iterdir()] == [f"{WRITER}{me.token}.lock"]  # the dead one's lock went too
        assert me.claim("x")
    finally:
        proc.kill()
        me.close()
    assert os.listdir(out) == []


def test_a_claim_is_never_followed_through_a_link(tmp_path):
    (tmp_path / f".x{CLAIM}").symlink_to(tmp_path / "elsewhere")
    w = Writer(tmp_path)
    with pytest.raises(ClaimError, match="symbolic link"):
        w.claim("x")
    w.close()
    assert not (tmp_path / "elsewhere").exists()


# -- the shared log -----------------------------------------------------------------------------
_APPENDER = """
import sys
from omnitts.batch.ledger import Ledger
ledger = Ledger(sys.argv[1])
for i in range(int(sys.argv[3])):
    ledger.write({"id": f"{sys.argv[2]}-{i}", "status": "error", "error": "x" * 5000})
"""


def test_concurrent_appends_never_tear_or_interleave_and_each_reader_sees_the_others(tmp_path):
    n = 150
    procs = [subprocess.Popen([sys.executable, "-c", _APPENDER, str(tmp_path), name, str(n)]) for name in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    lines = (tmp_path / "results.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 2 * n + 1
    ids = Counter(json.loads(line)["id"] for line in lines[:-1])  # every line whole: none torn or glued
    assert len(ids) == 2 * n and set(ids.values()) == {1}
    ledger = Ledger(tmp_path)
    assert ledger.arrived == set() and len(ledger.failed) == 2 * n  # at the start: earlier work, not "arrived"
    with open(tmp_path / "results.jsonl", "ab") as handle:  # another writer appends: a line, then half of one
        handle.write(b'{"id": "c", "status": "error", "error": "y"}\n{"id": "d", "sta')
    ledger.refresh()
    assert ledger.arrived == {"c"} and "d" not in ledger.failed  # a line still being written waits
    ledger.write({"id": "e", "status": "error", "error": "z"})  # closes the torn line before its own
    assert set(read_results(tmp_path)) == set(ids) | {"c", "e"}
    assert ledger.arrived == {"c"}  # its own record is not another writer's


def test_records_after_the_runs_start_are_the_runs_own(tmp_path):
    """A writer that joins a run late (a worker, a Ray actor) is told where the run began: what other writers
    recorded since then is `arrived` (this run's work, not an earlier run's), so --force never redoes it."""
    early = Ledger(tmp_path)
    early.write({"id": "before", "status": "error", "error": "x"})
    start = early.offset
    early.write({"id": "during", "status": "error", "error": "y"})
    assert Ledger(tmp_path).arrived == set()  # without `since`: everything there is earlier work
    late = Ledger(tmp_path, since=start)
    assert late.arrived == {"during"} and set(late.failed) == {"before", "during"}


def test_the_run_token_tells_this_runs_records_from_another_commands(tmp_path):
    """Records after `since` are `arrived`; of those, the ones carrying the run's token are `ours` (its workers',
    its Ray actors'), another command's are not, until a record of the run's comes after it. Without a token
    every arrived record is the run's (a stage joined without one cannot tell)."""
    start = Ledger(tmp_path).offset
    writer = Ledger(tmp_path)
    for item_id, run in (("mine", "r1"), ("other", "r2"), ("both", "r2"), ("both", "r1"), ("old", None)):
        writer.write({"id": item_id, "status": "error", "error": "x", **({"run": run} if run else {})})
    told = Ledger(tmp_path, since=start, run="r1")
    assert told.arrived == {"mine", "other", "both", "old"}
    assert [told.ours(i) for i in ("mine", "other", "both", "old", "never")] == [True, False, True, False, False]
    assert told.theirs == {"other", "old"}
    untold = Ledger(tmp_path, since=start)
    assert all(untold.ours(i) for i in ("mine", "other", "both", "old")) and not untold.theirs


def test_every_record_carries_its_writers_run_token(tmp_path):
    """A Batch's records carry the run token it is given (synth's, a worker's, a Ray actor's), and its Ledger
    takes the records with it for the run's; one given none records under a new token of its own, and counts
    every other writer's records as the run's (it cannot tell)."""
    from omnitts.batch.outdir import Batch
    from omnitts.batch.settings import Settings

    with Batch(tmp_path / "a", Settings()) as first, Batch(tmp_path / "b", Settings()) as second:
        assert len(first.run) == 16 and int(first.run, 16) >= 0 and first.run != second.run
        assert first.ledger.run is None
        first.record_bad("bad", "text: empty")
        assert read_results(tmp_path / "a")["bad"]["run"] == first.run
    with Batch(tmp_path / "a", Settings(), run="given", since=0) as told, \
            Batch(tmp_path / "a", Settings(), since=0) as untold:
        assert told.run == told.ledger.run == "given" and not told.ledger.ours("bad")
        assert untold.ledger.ours("bad")


# -- shards -------------------------------------------------------------------------------------
def test_shards_are_stable_and_cover_every_id_once():
    assert parse_shard("0/2") == (0, 2) and parse_shard(" 3/4 ") == (3, 4)
    for bad in ("2/2", "-1/2", "1", "a/b", "0/0", "1/2/3"):
        with pytest.raises(ShardError, match="K/N"):
            parse_shard(bad)
    # sha256-based: these values are the same on every machine and Python version (a salted hash() is not)
    assert [shard_of(f"item-{i}", 4) for i in range(8)] == [_sha_shard(f"item-{i}", 4) for i in range(8)]
    assert shard_of("a", 1000) == 250 and shard_of("línea-7", 7) == _sha_shard("línea-7", 7)
    ids = [f"utt{i:05d}" for i in range(3000)]
    for n in (1, 2, 3, 8):
        owners = Counter(sum(in_shard(i, k, n) for k in range(n)) for i in ids)
        assert owners == {1: len(ids)}
        sizes = Counter(shard_of(i, n) for i in ids)
        assert min(sizes.values()) > len(ids) / n * 0.8  # balanced, not a modulo of the length or the like


def _sha_shard(item_id: str, n: int) -> int:
    import hashlib

    return int(hashlib.sha256(item_id.encode()).hexdigest()[:16], 16) % n


# -- the batch: pending() with claims ------------------------------------------------------------
def _manifest(tmp_path, n=ITEMS):
    rows = [{"id": f"item-{i:03d}", "text": f"Sentence number {i} of the writers test.", "speaker": "ryan"}
            for i in range(n)]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, [r["id"] for r in rows]


def test_an_item_another_writer_holds_is_left_to_it_or_taken_over_when_it_lets_go(ckpt_dir, tmp_path):
    from omnitts.batch.manifest import BadLine, iter_manifest
    from omnitts.batch.ledger import record
    from omnitts.batch.outdir import Batch
    from omnitts.batch.settings import Settings
    from omnitts.config import load_config

    ckpt = ckpt_dir("custom_voice")
    cfg = load_config(ckpt)
    manifest, ids = _manifest(tmp_path, 4)
    items = [e for e in iter_manifest(manifest, cfg) if not isinstance(e, BadLine)]
    out = tmp_path / "out"
    other = Batch(out, Settings(greedy=True), cfg, "ckpt")
    mine = Batch(out, Settings(greedy=True), cfg, "ckpt")
    try:
        assert other.writer.claim(ids[0]) and other.writer.claim(ids[1])
        jobs = mine.pending(items)
        got = [next(jobs) for _ in range(2)]
        assert [j.request.id for j in got] == ids[2:]  # the held ones are passed over, not waited for
        assert next(jobs) is None  # only held items left: "nothing now"
        # the other writer records item 0 and lets it go; it dies before recording item 1
        fp = other._fingerprint(other.job(items[0]))
        other.ledger.write(record(ids[0], "error", error="boom", fingerprint=fp))
        other.writer.release(ids[0])
        other.writer.release(ids[1])
        time.sleep(0.25)
        rest = [j for j in jobs if j is not None]
        assert [j.request.id for j in rest] == [ids[1]]  # taken over; item 0 is the other's, not run twice
        assert mine.tally.others == 1
        assert set(mine.writer.claims) == set(ids[1:])  # held until saved
    finally:
        mine.close()
        other.close()
    assert sorted(p.name for p in out.iterdir()) == ["results.jsonl"]


def test_bad_lines_are_recorded_once_by_two_writers_a_few_hundred_to_a_write(ckpt_dir, tmp_path, monkeypatch):
    """Two writers record the same bad lines, interleaved: each line once in the log (the log's lock decides,
    without a claim per line), a re-run adds nothing, and a chunk of lines costs one fsync, not one each."""
    from omnitts.batch import outdir
    from omnitts.batch.outdir import Batch
    from omnitts.batch.settings import Settings
    from omnitts.config import load_config

    cfg = load_config(ckpt_dir("custom_voice"))
    out = tmp_path / "out"
    lines = [(f"bad-{i:04d}", f"speaker: 'nobody{i}' is not known") for i in range(700)]
    syncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append(fd), real_fsync(fd)))
    first, second = Batch(out, Settings(), cfg, "ckpt"), Batch(out, Settings(), cfg, "ckpt")
    try:
        first.record_bad_lines(lines[:300])
        second.record_bad_lines(lines)  # its first 300 are the first writer's already
        first.record_bad_lines(lines[300:])  # all the second writer's by now
        assert not first.writer.claims and not second.writer.claims
    finally:
        first.close()
        second.close()
    logged = list(records(out))
    assert Counter(r["id"] for r in logged) == Counter(i for i, _ in lines)
    assert all(r["status"] == "error" and r["error"] == dict(lines)[r["id"]] for r in logged)
    per = outdir.BAD_LINES_PER_WRITE
    assert len(syncs) <= -(-300 // per) + -(-400 // per), len(syncs)  # the first's 300, then the second's 400
    assert first.tally.failed == second.tally.failed == 700  # each counts them as its failures, as before
    again = Batch(out, Settings(), cfg, "ckpt")
    try:
        again.record_bad_lines(lines)
    finally:
        again.close()
    assert len(list(records(out))) == 700


# -- whole processes ----------------------------------------------------------------------------
def _synth(manifest, ckpt, out, *extra):
    cmd = [sys.executable, "-m", "omnitts", "synth", str(manifest), "-m", str(ckpt), "-o", str(out),
           "--greedy", "--max-frames", "6", "--max-batch", "4", "--dtype", "float32", "--quiet", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _check_exactly_once(out, ids):
    """Every id once in the log, good, its file decodable; nothing else left in the directory."""
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    counts = Counter(r["id"] for r in lines)
    assert counts == Counter(ids), {k: v for k, v in counts.items() if v != 1}
    for rec in lines:
        assert rec["status"] == "ok", rec
        info = sf.info(str(out / rec["path"]))
        assert info.frames == rec["samples"]
    names = {p.name for p in out.iterdir()}
    assert names == {"results.jsonl"} | {f"{i}.wav" for i in ids}, names - {f"{i}.wav" for i in ids}


@pytest.mark.parametrize("how", ["claims", "shards"])
def test_two_processes_on_one_directory_do_every_item_exactly_once(ckpt_dir, tmp_path, how):
    manifest, ids = _manifest(tmp_path)
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "out"
    extra = [["--shard", "0/2"], ["--shard", "1/2"]] if how == "shards" else [[], []]
    procs = [_synth(manifest, ckpt, out, *e) for e in extra]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    _check_exactly_once(out, ids)
    done = [_done_in_summary(err) for _, err in results]
    assert sum(done) == ITEMS, results
    if how == "claims":  # each summary accounts for the other's items: recorded during its run, or before it
        # began (a process that starts late on a loaded machine finds some already done and skips them)
        def count(pattern: str, err: str) -> int:
            found = re.search(pattern, " ".join(err.split()))  # the console wraps long lines
            return int(found[1]) if found else 0

        seen = [count(r"(\d+) items? recorded by other writers", err) + count(r"(\d+) items? already done in", err)
                for _, err in results]
        assert seen == done[::-1], results
    # a re-run finds everything done
    again = _synth(manifest, ckpt, out)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0 and f"{ITEMS} items already done" in err, err
    _check_exactly_once(out, ids)


def _done_in_summary(err: str) -> int:
    """The `done` cell of synth's closing table."""
    return int(re.search(r"│\s*(\d+) │", err)[1])


def _wait_for_records(out, count, procs, timeout=180):
    deadline = time.time() + timeout
    while len(list(records(out))) < count:
        assert time.time() < deadline and all(p.poll() is None for p in procs), "no progress"
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["claims", "shards"])
def test_one_of_two_killed_mid_run_then_a_rerun_finishes_exactly_once(ckpt_dir, tmp_path, how):
    manifest, ids = _manifest(tmp_path)
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "out"
    extra = [["--shard", "0/2"], ["--shard", "1/2"]] if how == "shards" else [[], []]
    procs = [_synth(manifest, ckpt, out, *e) for e in extra]
    _wait_for_records(out, 4, procs)
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    _, err = procs[1].communicate(timeout=300)
    assert procs[1].returncode == 0, err
    if how == "claims":  # the survivor took over what the killed one held: nothing is left
        _check_exactly_once(out, ids)
    rerun = _synth(manifest, ckpt, out, *extra[0])
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    _check_exactly_once(out, ids)


@pytest.mark.parametrize("sampling", [["--greedy"], ["--no-greedy", "--seed", "11"]])
def test_shards_give_the_codes_of_one_process(ckpt_dir, tmp_path, sampling):
    """Same line, same seed, same codes, however the manifest is cut: shards run other batch mates."""
    import numpy as np
    from typer.testing import CliRunner

    from omnitts.cli import app

    rows = [{"id": f"u{i}", "text": text, "speaker": "ryan", **({"seed": 100 + i} if i % 3 == 0 else {})}
            for i, text in enumerate(["Hello there.", "A longer sentence with a few more words in it.",
                                      "Short.", "Numbers: 1, 2, 3.", "Another line, quite different.",
                                      "Last one here."])]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ckpt = ckpt_dir("custom_voice")
    assert 0 < sum(shard_of(r["id"], 2) for r in rows) < len(rows)  # both shards have items

    def synth(out, *extra):
        args = ["synth", str(manifest), "-m", str(ckpt), "-o", str(out), "--max-frames", "8", "--max-batch", "4",
                "--dtype", "float32", "--save-codes", "-q", *sampling, *extra]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output

    synth(tmp_path / "one")
    synth(tmp_path / "sharded", "--shard", "0/2")
    synth(tmp_path / "sharded", "--shard", "1/2")
    for row in rows:
        one = np.load(tmp_path / "one" / f"{row['id']}.codes.npy")
        assert np.array_equal(one, np.load(tmp_path / "sharded" / f"{row['id']}.codes.npy")), row["id"]
        audio = [sf.read(str(tmp_path / d / f"{row['id']}.wav"), dtype="int16")[0] for d in ("one", "sharded")]
        # decoded among other streams: within one 16-bit step (docs/determinism.md, "The waveform")
        assert np.abs(audio[0].astype(int) - audio[1]).max() <= 1, row["id"]
    assert {r["seed"] for r in read_results(tmp_path / "one").values()} == \
        {r["seed"] for r in read_results(tmp_path / "sharded").values()}


def test_a_filesystem_without_locks_is_one_line_before_anything_runs(ckpt_dir, tmp_path, monkeypatch):
    import errno
    import fcntl

    from typer.testing import CliRunner

    from omnitts.cli import app

    def refuse(fd, how):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    manifest, _ = _manifest(tmp_path, 2)
    result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o",
                                      str(tmp_path / "out"), "-q"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "does not support file locks" in lines[0], result.output
    assert not list((tmp_path / "out").glob("*.wav"))
