"""`omnitts synth --workers N` / `--devices LIST`: several engine processes on one output directory.

The runs start real worker processes (spawn), so they go through a subprocess as a user's command
does; each worker loads the tiny checkpoint once. CPU workers only (`cpu,cpu`).
"""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from omnitts.workers import DevicesError, parse_devices
from omnitts.cli import app

ITEMS = 8


def _manifest(tmp_path, count=ITEMS):
    rows = [{"id": f"item-{i:02d}", "text": f"Sentence number {i} for the workers.", "speaker": "ryan"}
            for i in range(count)]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, [r["id"] for r in rows]


def _synth(manifest, ckpt, out, *extra, frames=6, wait=True):
    cmd = [sys.executable, "-m", "omnitts", "synth", str(manifest), "-m", str(ckpt), "-o", str(out),
           "--max-frames", str(frames), "--max-batch", "4", "--dtype", "float32", "--save-codes", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # A session of its own: no terminal delivers signals to its workers, so a signal the test sends the
    # command reaches them only if the command passes it on (as from `kill`), wherever the tests run.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    if not wait:
        return proc
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


def _records(out):
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _check_directory(out, ids):
    """Every id exactly once in results.jsonl, good, its files decodable; nothing temporary left."""
    records = _records(out)
    counts = Counter(r["id"] for r in records)
    assert counts == Counter(ids), f"ids not exactly once: {sorted(counts.items())}"
    assert all(r["status"] == "ok" for r in records), records
    for r in records:
        samples, rate = sf.read(out / r["path"])
        assert rate == 24000 and len(samples) == r["samples"] > 0
        assert np.load(out / f"{r['id']}.codes.npy").shape == (r["frames"], 16)
    leftovers = [p.name for p in out.iterdir() if p.name.endswith(".tmp") or "claim" in p.name.lower()]
    assert not leftovers, leftovers


def _codes(out, ids):
    return {i: np.load(out / f"{i}.codes.npy") for i in ids}


@pytest.mark.parametrize("decoding", [["--greedy"], ["--no-greedy", "--seed", "7"]], ids=["greedy", "seeded"])
def test_two_workers_finish_the_manifest_once_with_the_codes_of_one_process(ckpt_dir, tmp_path, decoding):
    manifest, ids = _manifest(tmp_path)
    ckpt = ckpt_dir("custom_voice")
    code, err = _synth(manifest, ckpt, tmp_path / "one", *decoding)
    assert code == 0, err
    code, err = _synth(manifest, ckpt, tmp_path / "two", *decoding, "--workers", "2", "--verbose")
    assert code == 0, err
    assert "started 2 workers: cpu, cpu" in err
    # --verbose: the workers' graph capture added up (CPU frames run eagerly: nothing captured)
    assert re.search(r"graph capture: none \(frames ran eagerly; [1-9]\d* engines? built\)", err), err
    assert err.count("omnitts synth ->") == 1, err  # one summary for the whole run
    _check_directory(tmp_path / "two", ids)
    one, two = _codes(tmp_path / "one", ids), _codes(tmp_path / "two", ids)
    for i in ids:
        assert np.array_equal(one[i], two[i]), i
    seeds = {r["id"]: r["seed"] for r in _records(tmp_path / "two")}
    assert seeds == {r["id"]: r["seed"] for r in _records(tmp_path / "one")}

    # The same command again: every item is done, so no worker starts, nor loads the model; one summary says so.
    code, err = _synth(manifest, ckpt, tmp_path / "two", *decoding, "--devices", "cpu,cpu")
    assert code == 0, err
    assert f"{ITEMS} items already done" in err and "loading checkpoint" not in err, err
    assert "started" not in err, err
    assert len(_records(tmp_path / "two")) == ITEMS
    # One new line: one worker is enough, and only one starts.
    with manifest.open("a") as f:
        f.write(json.dumps({"id": "new", "text": "A line added later.", "speaker": "ryan"}) + "\n")
    code, err = _synth(manifest, ckpt, tmp_path / "two", *decoding, "--devices", "cpu,cpu")
    assert code == 0, err
    assert "1 item to run: starting 1 of the 2 workers" in err and "started 1 worker: cpu" in err, err
    assert f"{ITEMS} items already done" in err, err
    _check_directory(tmp_path / "two", ids + ["new"])


def test_workers_count_a_damaged_file_as_the_one_process_run_does(ckpt_dir, tmp_path):
    """`--workers 2` over an earlier run's directory: a file damaged since (its record says done) and a changed
    line both run again, and the one summary tells them apart as the one-process summary does."""
    manifest, ids = _manifest(tmp_path, count=4)
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "out"
    code, err = _synth(manifest, ckpt, out, "--greedy")  # the earlier run, one process
    assert code == 0, err
    (out / f"{ids[1]}.wav").write_bytes(b"truncated")
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    rows[2]["text"] = "Changed."
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, err = _synth(manifest, ckpt, out, "--greedy", "--workers", "2")
    assert code == 0, err
    err = " ".join(err.split())  # the console wraps long lines
    assert ("2 items run again: 1 with the line or the options changed since the earlier run, 1 with the file "
            "damaged or missing (each file replaced)") in err, err
    assert "2 items already done" in err, err
    assert [r["id"] for r in _records(out)][len(ids):] in ([ids[1], ids[2]], [ids[2], ids[1]])

def _worker_pids(parent: int) -> list[int]:
    """The worker processes of `parent`, from /proc: its children started by multiprocessing's spawn (not
    the resource tracker it may also start)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = open(f"/proc/{entry}/status").read()
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        ppid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
        if ppid == parent and "spawn_main" in cmdline:
            pids.append(int(entry))
    return sorted(pids)


def _wait(condition, proc, what, timeout=300):
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"synth ended before {what}: {proc.communicate()[1]}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_killed_worker_is_named_and_the_other_finishes_its_items(ckpt_dir, tmp_path):
    manifest, ids = _manifest(tmp_path, count=16)
    out = tmp_path / "out"
    proc = _synth(manifest, ckpt_dir("custom_voice"), out, "--greedy", "--workers", "2", frames=10, wait=False)
    _wait(lambda: len(_worker_pids(proc.pid)) == 2, proc, "two workers")
    _wait(lambda: len(_records(out)) >= 1, proc, "a first record")
    victim = _worker_pids(proc.pid)[1]
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    assert ("worker 1 (cpu) died: killed by SIGKILL; started again (1 of 3); the items it was running will run "
            "alone") in " ".join(err.split()), err
    assert proc.returncode == 0, err  # every item has audio: the survivor took the rest over
    _check_directory(out, ids)


_BREAK_ONE = """
import os

if os.environ.get("TEST_BREAK_ONE"):  # the first worker to run a step gets a device that breaks at once
    from omnitts.device import base
    from omnitts.engine import engine

    marker, step, mine = os.environ["TEST_BREAK_ONE"], engine.Engine.step, []

    def faulty(self):
        if not mine:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                mine.append(True)
            except FileExistsError:
                mine.append(False)
        if mine[0]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return step(self)

    engine.Engine.step = faulty
    base.Backend.broken = lambda self: (
        "RuntimeError: CUDA error: an illegal memory access was encountered" if mine and mine[0] else None)
"""


def _hook_workers(tmp_path, monkeypatch, code: str, **environ) -> None:
    """Run `code` first in every Python the test starts (a sitecustomize.py on PYTHONPATH: the spawned workers
    are not patched by monkeypatch), with `environ` set."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(code)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]))
    for name, value in environ.items():
        monkeypatch.setenv(name, value)


def test_a_worker_whose_device_breaks_stops_and_the_other_finishes_its_items(ckpt_dir, tmp_path, monkeypatch):
    """A sticky device error in one worker: it stops (its running items unrecorded, not failed) and is started
    again (a new process, a new device context: this one works), and the run ends with every item done once."""
    manifest, ids = _manifest(tmp_path)
    out = tmp_path / "out"
    _hook_workers(tmp_path, monkeypatch, _BREAK_ONE, TEST_BREAK_ONE=str(tmp_path / "broken-worker"))
    code, err = _synth(manifest, ckpt_dir("custom_voice"), out, "--greedy", "--workers", "2")
    err = " ".join(err.split())  # the console wraps long lines
    who = re.search(r"error: (worker \d \(cpu\)): the cpu device stopped working \(RuntimeError: CUDA error: an "
                    r"illegal memory access was encountered\)", err)
    assert who, err
    assert f"{who.group(1)} stopped; started again (1 of 3); the items it was running will run alone" in err, err
    assert "died" not in err and code == 0, err  # every item has audio
    _check_directory(out, ids)


_REFUSE_ONE = """
import errno, os

if os.environ.get("TEST_REFUSE"):  # one item's file cannot be written (EACCES at its rename), in every worker
    from omnitts.io import audio

    commit = audio.AudioSink.commit

    def refusing(sink):
        if sink.path.stem == os.environ["TEST_REFUSE"]:
            raise OSError(errno.EACCES, "Permission denied", sink.tmp)
        return commit(sink)

    audio.AudioSink.commit = refusing
"""


def test_a_write_error_in_a_worker_ends_the_run_with_one_line_naming_the_file(ckpt_dir, tmp_path, monkeypatch):
    """EACCES, EROFS, EIO in a worker end the run as in one process: one line naming the file (not its temporary
    name) and the error, exit 1. It said `[Errno 13] Permission denied: '.../.item-03.wav.omnitts-....tmp'` per
    worker, then that the items had no audio because a worker died."""
    manifest, ids = _manifest(tmp_path)
    out = tmp_path / "out"
    _hook_workers(tmp_path, monkeypatch, _REFUSE_ONE, TEST_REFUSE="item-03")
    code, err = _synth(manifest, ckpt_dir("custom_voice"), out, "--greedy", "--workers", "2")
    last = " ".join(err.split()).rsplit("error: ", 1)[-1]  # the console wraps long lines
    assert code == 1 and re.fullmatch(
        rf"cannot write {re.escape(str(out / 'item-03.wav'))}: Permission denied \(EACCES\): \d+ items? done in "
        rf"this run \({re.escape(str(out))}/results.jsonl\); fix that and run the same command again to resume",
        last), err
    assert "item-03" not in {r["id"] for r in _records(out)}
    monkeypatch.delenv("TEST_REFUSE")
    assert _synth(manifest, ckpt_dir("custom_voice"), out, "--greedy", "--workers", "2")[0] == 0
    _check_directory(out, ids)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)],
                         ids=["term", "int", "hup"])
def test_a_signal_to_the_parent_stops_the_workers(ckpt_dir, tmp_path, sig, code):
    manifest, ids = _manifest(tmp_path, count=24)
    out = tmp_path / "out"
    proc = _synth(manifest, ckpt_dir("custom_voice"), out, "--greedy", "--workers", "2", frames=10, wait=False)
    _wait(lambda: len(_records(out)) >= 1, proc, "a first record")
    workers = _worker_pids(proc.pid)
    proc.send_signal(sig)  # as `kill` sends it: to the command alone, which passes it on to its workers
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == code, err
    assert "stopped early" in err and err.count("omnitts synth ->") == 1 and "died" not in err, err
    assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")], "a worker outlived the parent"
    done = [r["id"] for r in _records(out)]
    assert len(done) == len(set(done)) < len(ids)  # stopped before the end, nothing twice
    for record in _records(out):
        assert sf.read(out / record["path"])[0].size == record["samples"]


def test_a_signal_to_the_whole_group_is_one_stop_not_two(ckpt_dir, tmp_path):
    """Slurm's scancel (and `kill -TERM -PGID`, a closed terminal's SIGHUP) signals every process of the group: each
    worker had the stop from it and again from the parent, counted that as a second stop and dropped its running
    items ("stopping at once"). The echo is one stop: the running items finish, as after a signal to the parent."""
    manifest, ids = _manifest(tmp_path, count=24)
    out = tmp_path / "out"
    proc = _synth(manifest, ckpt_dir("custom_voice"), out, "--greedy", "--workers", "2", frames=10, wait=False)
    _wait(lambda: len(_records(out)) >= 1, proc, "a first record")
    _wait(lambda: _running(out), proc, "an item in the engine")
    workers, running = _worker_pids(proc.pid), _running(out)
    os.killpg(proc.pid, signal.SIGTERM)  # the command leads its own group (_synth): it and its workers
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err
    assert "stopped early" in err and "died" not in err, err
    assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")], "a worker outlived the parent"
    done = [r["id"] for r in _records(out)]
    assert len(done) == len(set(done)) < len(ids)
    assert running <= set(done), f"items in the engine at the stop were dropped: {sorted(running - set(done))}"


def _running(out) -> set[str]:
    """The ids whose claims say they are in the engine now (claims.py)."""
    from omnitts.batch.claims import CLAIM

    running = set()
    for path in out.glob(f".*{CLAIM}"):
        try:
            if json.loads(path.read_text() or "{}").get("running") is True:
                running.add(path.name[1:-len(CLAIM)])
        except (OSError, ValueError):
            pass  # released (deleted) or being written as we look
    return running


_FULL_DISK = """
import errno, os

if os.environ.get("TEST_FULL_DISK"):  # every worker's disk is full from the item named on: ENOSPC at its rename
    from omnitts.io import audio

    commit = audio.AudioSink.commit

    def full(sink):
        if sink.path.stem >= os.environ["TEST_FULL_DISK"]:
            raise OSError(errno.ENOSPC, "No space left on device", str(sink.path))
        return commit(sink)

    audio.AudioSink.commit = full
"""


def test_a_full_disk_under_workers_is_one_closing_line_not_each_workers_errno(ckpt_dir, tmp_path, monkeypatch):
    """A full disk under --workers said, per worker, `error: worker 1 (cpu): [Errno 28] No space left on device:
    '.../item-05.wav'` and `worker 1 (cpu) died: exited with code 1; the others take over its items` (no other
    could) before the closing `no space left on OUT` line. Now each worker is said to have stopped for it, the
    closing line says what to do, exit 1, and the same command resumes once there is space."""
    manifest, ids = _manifest(tmp_path)
    out = tmp_path / "out"
    _hook_workers(tmp_path, monkeypatch, _FULL_DISK, TEST_FULL_DISK="item-04")
    code, err = _synth(manifest, ckpt_dir("custom_voice"), out, "--greedy", "--workers", "2")
    flat = " ".join(err.split())  # the console wraps long lines
    assert code == 1 and "Errno" not in flat and "died" not in flat, err
    assert re.search(rf"worker \d \(cpu\) stopped; no space left on {re.escape(str(out))}", flat), err
    assert re.search(rf"error: no space left on {re.escape(str(out))}: \d+ items? done in this run", flat), err
    monkeypatch.delenv("TEST_FULL_DISK")
    assert _synth(manifest, ckpt_dir("custom_voice"), out, "--greedy", "--workers", "2")[0] == 0
    _check_directory(out, ids)


_SLOW_START = """
import os
import time

if "spawn_main" in open("/proc/self/cmdline", "rb").read().decode(errors="replace"):  # a worker, starting
    open(os.path.join(os.environ["TEST_SLOW_START"], str(os.getpid())), "w").close()
    time.sleep(2)
"""


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)],
                         ids=["term", "int", "hup"])
def test_a_signal_while_the_workers_are_still_starting_stops_them_cleanly(ckpt_dir, tmp_path, monkeypatch, sig,
                                                                            code):
    """A stop that the parent passes on before a worker has its handlers (still importing, as on a loaded
    machine) waits for them: the worker stops as asked, not killed mid-import with a traceback."""
    manifest, _ = _manifest(tmp_path)
    out, starting = tmp_path / "out", tmp_path / "starting"
    starting.mkdir()
    _hook_workers(tmp_path, monkeypatch, _SLOW_START, TEST_SLOW_START=str(starting))
    proc = _synth(manifest, ckpt_dir("custom_voice"), out, "--greedy", "--workers", "2", wait=False)
    _wait(lambda: len(os.listdir(starting)) == 2, proc, "two workers starting")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == code, err
    assert "stopped early" in err and "died" not in err and "Traceback" not in err, err
    assert not _records(out)


@pytest.mark.parametrize("flags,message", [
    (["--devices", "cuda:x"], "--devices 'cuda:x': 'cuda:x' is not a device"),
    (["--devices", "gpu:0"], "'gpu:0' is not a device"),
    (["--devices", "cpu:0"], "cpu takes no index"),
    (["--devices", "cuda"], "name the cuda device's index (cuda:0)"),
    (["--devices", "npu:3-1"], "the range ends before it starts"),
    (["--devices", "cpu,npu:0"], "mixes cpu and npu"),
    (["--devices", "cpu,cpu", "--workers", "3"], "--workers 3 and --devices 'cpu,cpu' (2 devices) disagree"),
    (["--devices", "cuda:0", "--device", "cpu"], "--device cpu and --devices 'cuda:0' disagree"),
    (["--workers", "0"], "--workers 0: give 1 or more"),
    # a typo's billion workers was a list built for minutes (the run hung), not a one-line refusal
    (["--workers", "1000000000"], "--workers 1000000000: one engine process per device, and no machine has"),
    (["--workers", "100000000000000", "--device", "cuda"], "no machine has that many (at most 1024; more"),
    (["--devices", "npu:0-99999999"], "--devices 'npu:0-99999999': more devices than a machine has"),
    (["--devices", "cuda:0-1000,cuda:1001-1024"], "more devices than a machine has (one worker each, at most 1024"),
])
def test_bad_worker_flags_are_one_line_and_exit_2_before_anything_loads(ckpt_dir, tmp_path, flags, message):
    manifest, _ = _manifest(tmp_path, count=2)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                      *flags])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
    assert not out.exists()  # refused before the output directory or the manifest were touched


@pytest.mark.parametrize("flags", [["--workers", "3"], ["--devices", "cpu,cpu,cpu"]])
def test_more_cpu_workers_than_cores_are_refused_before_anything_loads(ckpt_dir, tmp_path, monkeypatch, flags):
    """Each CPU worker loads its own model and the workers split the cores: more workers than cores only
    oversubscribe them (and, with a real checkpoint, run the machine out of memory)."""
    from omnitts import workers

    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    manifest, _ = _manifest(tmp_path, count=4)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                      *flags])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == ("error: 3 CPU workers: omnitts may use 2 CPU cores here, and CPU workers split "
                                     "them (each loads its own copy of the model); give at most 2")
    assert not out.exists()


def test_parse_devices_expands_ranges_and_worker_counts():
    assert parse_devices("npu:0-3", None, "cpu") == ["npu:0", "npu:1", "npu:2", "npu:3"]
    assert parse_devices("cuda:0, cuda:2", 2, "cuda") == ["cuda:0", "cuda:2"]
    assert parse_devices("cpu,cpu", None, "cpu") == ["cpu", "cpu"]
    assert parse_devices(None, 3, "cuda") == ["cuda:0", "cuda:1", "cuda:2"]
    assert parse_devices(None, 2, "cpu") == ["cpu", "cpu"]
    assert parse_devices(None, 1, "cuda") is None and parse_devices(None, None, "cpu") is None  # one process
    with pytest.raises(DevicesError, match="disagree"):
        parse_devices("npu:0-7", 4, "npu")


def test_cpu_workers_split_the_cores(monkeypatch):
    from omnitts import workers

    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert workers.cpu_threads(["cpu"] * 3) == 2
    assert workers.cpu_threads(["cpu"] * 16) == 1
    assert workers.cpu_threads(["cuda:0", "cuda:1"]) is None


def test_devices_the_machine_lacks_are_named_as_given(ckpt_dir, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    manifest, _ = _manifest(tmp_path, count=2)
    result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o",
                                      str(tmp_path / "out"), "--devices", "cuda:0-1"])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: --devices cuda:0-1: no CUDA device is visible to torch "
                                    "(CPU workers: --devices cpu,cpu)")
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:  # never installed here (it breaks torch without CANN)
        result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o",
                                          str(tmp_path / "out"), "--devices", "npu:0-1"])
        assert result.exit_code == 2
        assert result.output.startswith("error: --devices npu:0-1 needs torch_npu and the Ascend CANN toolkit"), \
            result.output


def test_a_record_written_by_a_worker_killed_before_reporting_it_is_counted_once_and_only_if_its_runs(tmp_path):
    """A worker killed between writing an item's record and reporting it: the parent reads the log and counts
    that record as the worker's, but only a record carrying this command's run token; the same id recorded by
    another command writing OUT is not this run's work (its claim is free, and it runs again or is skipped)."""
    from omnitts.batch.ledger import Ledger, record
    from omnitts.batch.tally import Tally
    from omnitts.pool import Pool

    for run, counted in (("this-run", True), ("another", False)):
        out = tmp_path / run
        out.mkdir()
        tally = Tally()
        pool = Pool(None, ["cpu"], tally, Ledger(out, run="this-run"))
        pool.saving[0] = "x"  # its worker said ("saving", 0, "x"), then died
        Ledger(out).write(record("x", "ok", path="x.wav", seconds=1.5, samples=36000, frames=19, run=run))
        events = list(pool._recover(0))
        assert (events == [("record", 0, "x", "ok", None, 1.5)]) is counted
        assert (tally.done, tally.seconds) == ((1, 1.5) if counted else (0, 0.0))
