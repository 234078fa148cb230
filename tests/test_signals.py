"""Ctrl-C and SIGTERM in `omnitts synth`, driven by real signals: once finishes the running items, twice
drops them. SIGTERM (what `kill`, schedulers and `docker stop` send) does what Ctrl-C does, exit 143.

tests/test_kill.py interrupts at random points and checks the resumed run; these tests pin what each
press does to the items in flight (README "Resume"): the first stops new items from starting and lets
the running ones finish (their records are written, exit 130, or 143 for SIGTERM); a second drops the
running ones at once (no record, no audio file, no temporary file left; the same exit code), and the
same command resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import soundfile as sf

BATCH = 4
LONG = 4 * BATCH  # more than the pipeline prepares ahead (2 x BATCH, at least 8): items start in manifest order,
# not longest first as the last ones of a manifest do


def _manifest(path, long_seconds: float, count: int):
    """A 3-frame item first, then `count` items of `long_seconds` each (12.5 frames a second)."""
    rows = [{"id": "first", "text": "A short first line.", "speaker": "ryan", "max_seconds": 0.24}]
    rows += [{"id": f"long-{i:02d}", "text": f"Long line number {i}.", "speaker": "ryan", "max_seconds": long_seconds}
             for i in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


class _Synth:
    """`python -m omnitts synth` in a subprocess, its stderr collected line by line as it comes."""

    def __init__(self, manifest, ckpt, out, nohup: bool = False):
        cmd = [sys.executable, "-m", "omnitts", "synth", str(manifest), "-m", str(ckpt), "-o", str(out), "--greedy",
               "--max-batch", str(BATCH), "--quiet"]
        self.out = out
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200"),
                                     preexec_fn=(lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup else None)
        self.err: list[str] = []
        self.reader = threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True)
        self.reader.start()

    def records(self) -> list[dict]:
        path = self.out / "results.jsonl"
        lines = path.read_text().split("\n")[:-1] if path.exists() else []  # complete lines only
        return [json.loads(line) for line in lines]

    def wait_for(self, condition, what: str, timeout: float = 120):
        deadline = time.time() + timeout
        while not condition():
            assert self.proc.poll() is None, f"synth ended before {what}: {''.join(self.err)}"
            assert time.time() < deadline, f"timed out waiting for {what}: {''.join(self.err)}"
            time.sleep(0.02)

    def finish(self, timeout: float = 120) -> str:
        self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return "".join(self.err)


SIGNALS = pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["int", "term"])


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
                         ids=["int", "term", "hup"])
def test_one_sigint_finishes_the_running_items_and_starts_no_more(ckpt_dir, tmp_path, sig, code):
    rows = _manifest(tmp_path / "m.jsonl", long_seconds=6.4, count=LONG)  # 80 frames each
    run = _Synth(tmp_path / "m.jsonl", ckpt_dir("custom_voice"), tmp_path / "out")
    # The first item ends after 3 frames, while the BATCH - 1 admitted beside it have ~77 to go (time for the
    # signal to land before they end, even on a loaded machine).
    run.wait_for(lambda: run.records(), "the first record")
    run.proc.send_signal(sig)
    err = run.finish()
    assert run.proc.returncode == code, err
    assert "stopping: finishing the items in progress" in err and "stopped early" in err, err
    records = run.records()
    ids = [r["id"] for r in records]
    # The running ones finished (whole), nothing queued behind them started.
    assert ids[0] == "first" and {f"long-{i:02d}" for i in range(BATCH - 1)} <= set(ids), ids
    assert len(ids) <= BATCH + 1 < len(rows), ids
    assert f"stopped early, {len(rows) - len(ids)} items not run yet" in err, err
    assert all(r["status"] == "ok" for r in records), records
    for r in records:
        assert sf.info(run.out / r["path"]).frames == r["frames"] * 1920 and r["frames"] in (3, 80), r
    assert not list(run.out.glob(".*.tmp"))


@SIGNALS
def test_a_second_sigint_drops_the_running_items_and_the_run_resumes(ckpt_dir, tmp_path, sig, code):
    # 1500 frames each: finishing them (what a single Ctrl-C does) would take far past the assertions.
    rows = _manifest(tmp_path / "m.jsonl", long_seconds=120, count=LONG)
    run = _Synth(tmp_path / "m.jsonl", ckpt_dir("custom_voice"), tmp_path / "out")
    run.wait_for(lambda: run.records(), "the first record")
    # Audio of the running items is streaming into temporary files (a codec chunk is 25 frames).
    run.wait_for(lambda: list(run.out.glob(".long-*.tmp")), "a running item's temporary file")
    run.proc.send_signal(sig)
    # Two signals before the handler runs would count as one: wait until it has run.
    run.wait_for(lambda: any("stopping:" in line for line in run.err), "the first press's message")
    run.proc.send_signal(sig)
    err = run.finish(timeout=60)
    assert run.proc.returncode == code, err
    assert "interrupted: finished items are recorded" in err and "stopped early" not in err, err
    assert [r["id"] for r in run.records()] == ["first"]  # the running items were dropped, not finished
    assert sorted(p.name for p in run.out.iterdir()) == ["first.wav", "results.jsonl"]  # no partial or temp file
    assert sf.info(run.out / "first.wav").frames == 3 * 1920

    # The same command resumes (a shorter budget keeps it quick: done items are skipped, whatever their budget).
    _manifest(tmp_path / "m.jsonl", long_seconds=0.4, count=LONG)
    again = _Synth(tmp_path / "m.jsonl", ckpt_dir("custom_voice"), tmp_path / "out")
    err = again.finish()
    assert again.proc.returncode == 0, err
    records = again.records()
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in rows)  # each id once
    assert all(r["status"] == "ok" for r in records)
    for r in records:
        assert sf.info(run.out / r["path"]).frames == r["frames"] * 1920
    assert not list(run.out.glob(".*.tmp"))


def test_sighup_under_nohup_is_ignored_and_the_run_goes_on(ckpt_dir, tmp_path):
    """SIGHUP stops a run as SIGTERM does (exit 129, above), but not one started with it ignored (`nohup`): the
    terminal closing must not stop it."""
    rows = _manifest(tmp_path / "m.jsonl", long_seconds=0.4, count=3)
    run = _Synth(tmp_path / "m.jsonl", ckpt_dir("custom_voice"), tmp_path / "out", nohup=True)
    run.wait_for(lambda: run.records(), "the first record")
    run.proc.send_signal(signal.SIGHUP)
    err = run.finish()
    assert run.proc.returncode == 0, err
    assert sorted(r["id"] for r in run.records()) == sorted(r["id"] for r in rows)


SLOW_IMPORT = """
import os, pathlib, sys, time


class _SlowImport:  # one module's import takes 3 s longer, and says when it starts
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["OMNITTS_TEST_SLOW"]:
            sys.meta_path.remove(self)
            pathlib.Path(os.environ["OMNITTS_TEST_MARK"]).write_text("importing " + name)
            time.sleep(3)
        return None


sys.meta_path.insert(0, _SlowImport())
"""
# The `omnitts` console script, as pip installs it: its entry point, loaded and called.
CONSOLE_SCRIPT = ("import sys; from importlib.metadata import entry_points; "
                  "(ep,) = entry_points(group='console_scripts', name='omnitts'); sys.argv[0] = 'omnitts'; "
                  "sys.exit(ep.load()())")


@SIGNALS
@pytest.mark.parametrize("slow,command", [("torch", ["-m", "omnitts"]), ("typer", ["-c", CONSOLE_SCRIPT])],
                         ids=["torch", "typer"])
def test_a_signal_while_the_command_imports_stops_with_one_line_and_the_signals_code(ckpt_dir, tmp_path, sig,
                                                                                   code, slow, command):
    """A Ctrl-C or SIGTERM while the command imports says `interrupted` and exits 130 or 143, as later in the
    run: while torch imports (~2 s, once the arguments are read; it printed an import traceback when `import
    omnitts` brought torch in, and typer then turned either signal into a silent 130), and while the command
    line's own modules import, before any command runs (typer, rich: ~0.3 s; the console script's entry point
    installs the handler before it imports them: a traceback before)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SLOW_IMPORT)
    _manifest(tmp_path / "m.jsonl", long_seconds=0.4, count=2)
    mark = tmp_path / "mark"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
               OMNITTS_TEST_MARK=str(mark), OMNITTS_TEST_SLOW=slow)
    proc = subprocess.Popen([sys.executable, *command, "synth", str(tmp_path / "m.jsonl"), "-m",
                             str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "out"), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 60
    while not mark.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, f"{slow}'s import never started"
        time.sleep(0.02)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / "results.jsonl").exists() or not (tmp_path / "out" / "results.jsonl").read_text()


def test_the_progress_bar_gives_no_eta_once_a_stop_is_asked_for():
    """At 2 of 30 items a stopped run's bar said 'eta 0:00:01' (its rate, over the items left) while it was about
    to leave 28 of them; the ETA goes at the first signal, the rest of the bar stays."""
    import io

    from rich.console import Console

    from omnitts.cli.display import progress_bar
    from omnitts.cli.stopping import GracefulStop

    console = Console(file=io.StringIO(), width=200)
    progress = progress_bar(console, quiet=False)
    task = progress.add_task("synthesizing", total=30, rate="")
    for done in (1, 2):
        progress.update(task, completed=done)
        time.sleep(0.05)
    eta = progress.columns[5]
    assert str(eta.render(progress.tasks[0])) not in ("-:--:--", "")  # an estimate while the run goes on
    stop = GracefulStop(console, progress)
    stop._handle(signal.SIGINT, None)
    assert stop.requested() and stop.exit_code == 130
    assert str(eta.render(progress.tasks[0])) == "-:--:--"
    assert "finishing the items in progress" in console.file.getvalue()
