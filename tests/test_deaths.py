"""An item that kills the process running it is pinned on it and recorded failed; the run finishes.

A process that dies (SIGKILL, a crash in a native library, the out-of-memory killer, a device that
broke) cannot say which of its running items was at fault. Its claims can: each says whether its item
was running (batch/claims.py). The next writer to claim such an item runs it alone; an item whose
process died while it ran alone is recorded failed without running again.

The kills here are real: a `sitecustomize.py` on the command's PYTHONPATH makes `Engine.step` SIGKILL its
own process once a chosen item has run two frames.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from omnitts.batch.claims import CLAIM, Writer, deaths_in, sweep
from omnitts.batch.ledger import read_results
from omnitts.engine import engine as engine_module
from omnitts.engine.pipeline import Job, Pipeline
from omnitts.request import Request

TEXTS = {"a": "First line here.", "b": "The second one kills.", "c": "Third, and fine.", "d": "Fourth line.",
         "e": "Fifth line.", "f": "Sixth and last."}


# -- the claims' record of deaths ---------------------------------------------------------------
def _stamp(out, item_id) -> dict:
    return json.loads((out / f".{item_id}{CLAIM}").read_text())


def test_a_claim_counts_a_death_only_for_an_item_that_was_running(tmp_path):
    dead = Writer(tmp_path)
    for item_id in "xyz":
        assert dead.claim(item_id)
    dead.running("x")
    dead.running("y", alone=True)
    dead.abandon_running()  # as a process that died: its running claims stay, unlocked
    dead.close()  # z, claimed but never running, is released as a clean exit would
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".x{CLAIM}", f".y{CLAIM}"]
    assert sweep(tmp_path) == 0  # deaths are kept for the next claimer
    me = Writer(tmp_path)
    assert me.claim("x") and me.claim("y") and me.claim("z")
    assert me.deaths == {"x": (1, False), "y": (1, True)}
    assert _stamp(tmp_path, "x")["deaths"] == 1 and "running" not in _stamp(tmp_path, "x")
    me.release("z")
    me.release("y", recorded=False)  # let go unrun (a stop): its deaths stay
    assert deaths_in(_stamp(tmp_path, "y")) == (1, True)
    me.running("x", alone=True)
    me.abandon_running()  # died again, x alone this time
    me.close()
    again = Writer(tmp_path)
    assert again.claim("x") and again.deaths["x"] == (2, True)
    again.release("x")  # recorded: its history goes with the claim
    again.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".y{CLAIM}"]


def test_a_stop_clears_the_running_marks_so_a_kill_after_it_counts_no_death(tmp_path):
    w = Writer(tmp_path)
    assert w.claim("x")
    w.running("x")
    w.stopping()  # SIGTERM: the running items finish; a SIGKILL that follows is the scheduler's doing
    assert "running" not in _stamp(tmp_path, "x")
    w.abandon_running()
    w.close()
    assert sweep(tmp_path) == 0 and list(tmp_path.iterdir()) == []


def test_writers_taken_down_by_a_stop_leave_no_death_and_earlier_marks_stay(tmp_path):
    """A command stopped by Ctrl-C or SIGTERM on Ray: Ray ends its actors mid-item, their running claims stay,
    unlocked. `clear_stopped` clears the marks stamped since the command began (deaths carried from before
    stay), so the stop counts no death: two stops had an innocent item recorded failed ("died twice")."""
    from omnitts.batch.claims import clear_stopped

    earlier = Writer(tmp_path)  # a writer that died before the command began: its death counts
    assert earlier.claim("old")
    earlier.running("old")
    earlier.abandon_running()
    earlier.close()
    since = time.time() + 0.01
    time.sleep(0.02)
    actor = Writer(tmp_path)
    assert actor.claim("x") and actor.claim("old")  # old: run again (alone) by this command, one death carried
    actor.running("x")
    actor.running("old", alone=True)
    live = Writer(tmp_path)  # another writer, still at work: its claim is not touched
    assert live.claim("y")
    live.running("y")
    actor.abandon_running()  # Ray took it down
    actor.close()
    assert clear_stopped(tmp_path, since, wait=0.5) == 2
    assert deaths_in(_stamp(tmp_path, "x")) == (0, False) and deaths_in(_stamp(tmp_path, "old")) == (1, False)
    assert _stamp(tmp_path, "y")["running"] is True
    live.close()


def test_an_item_out_of_the_engine_counts_no_death(tmp_path):
    """Finished and waiting to be saved (or being saved): a death now is not the item's doing."""
    w = Writer(tmp_path)
    assert w.claim("x")
    w.running("x")
    w.settled("x")
    assert "running" not in _stamp(tmp_path, "x")
    w.abandon_running()
    w.close()
    assert list(tmp_path.iterdir()) == []


def test_a_kill_between_an_items_record_and_its_release_counts_no_death(ckpt_dir, tmp_path):
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "out"
    code, err = _synth(tmp_path, ckpt, out, kill_after_record="c")
    assert code == -signal.SIGKILL, err
    assert "running" not in _claims(out).get("c", {})  # it had left the engine before its record
    code, err = _synth(tmp_path, ckpt, out)
    assert code == 0, err
    assert _claims(out) == {} and all(r["status"] == "ok" for r in read_results(out).values())


def test_a_death_recorded_for_an_item_that_is_done_is_cleared_by_the_next_run(ckpt_dir, tmp_path):
    """A writer killed after an item's record and before its claim went leaves a claim that says running;
    the next run finds the item done and deletes that claim (it is never claimed again otherwise)."""
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "out"
    assert _synth(tmp_path, ckpt, out)[0] == 0
    (out / f".a{CLAIM}").write_text(json.dumps({"id": "a", "running": True, "deaths": 1, "alone": True}))
    code, err = _synth(tmp_path, ckpt, out)
    assert code == 0 and f"{len(TEXTS)} items already done" in err, err
    assert _claims(out) == {}


def test_deaths_in_reads_what_any_claim_says():
    assert deaths_in({}) == (0, False)
    assert deaths_in({"running": True}) == (1, False)
    assert deaths_in({"running": True, "alone": True, "deaths": 1, "died_alone": False}) == (2, True)
    assert deaths_in({"deaths": 1, "died_alone": True}) == (1, True)
    assert deaths_in({"deaths": "many", "running": "yes"}) == (0, False)  # a foreign or damaged claim


# -- the pipeline: alone, and failed without running --------------------------------------------
def _jobs(tts, **flags):
    return [Job(Request(text, speaker="ryan", id=name), tts.default_params(greedy=True, max_frames=6),
                **flags.get(name, {})) for name, text in TEXTS.items()]


def test_an_alone_job_runs_with_no_other_item_beside_it_and_gives_the_same_codes(tts_factory, monkeypatch):
    tts = tts_factory("custom_voice", max_batch=4)
    clean = {o.job.request.id: o for o in Pipeline(tts).run(_jobs(tts))}
    step, seen = engine_module.Engine.step, []

    def watched(self):
        out = step(self)
        seen.append({seq.tag[0].job.request.id for seq in self.scheduler.running})
        return out

    monkeypatch.setattr(engine_module.Engine, "step", watched)
    told = []
    outcomes = {o.job.request.id: o for o in Pipeline(tts, started=lambda job: told.append(job.request.id))
                .run(_jobs(tts, c={"alone": True}))}
    assert [ids for ids in seen if "c" in ids and ids != {"c"}] == []  # c never shared a step
    assert any(len(ids) > 1 for ids in seen)  # the others were batched
    assert sorted(told) == sorted(TEXTS)  # each item told once, before it ran
    for name in TEXTS:
        assert outcomes[name].ok
        np.testing.assert_array_equal(outcomes[name].result.codes, clean[name].result.codes)


def test_a_job_marked_to_fail_fails_without_running(tts_factory):
    tts = tts_factory("custom_voice", max_batch=4)
    told = []
    outcomes = {o.job.request.id: o for o in Pipeline(tts, started=lambda job: told.append(job.request.id))
                .run(_jobs(tts, b={"fail": "the process running this item died twice"}))}
    assert outcomes["b"].error == "the process running this item died twice" and "b" not in told
    assert all(outcomes[name].ok for name in TEXTS if name != "b")


# -- real deaths through the command ------------------------------------------------------------
_KILLER = """
import os
import signal

if os.environ.get("TEST_KILL_ON"):  # SIGKILL this process once item TEST_KILL_ON has run two frames
    from omnitts.engine import engine

    step, target = engine.Engine.step, os.environ["TEST_KILL_ON"]

    def killing(self):
        if any(seq.tag[0].job.request.id == target and seq.launched >= 2 for seq in self.scheduler.running):
            os.kill(os.getpid(), signal.SIGKILL)
        return step(self)

    engine.Engine.step = killing

if os.environ.get("TEST_KILL_AFTER_RECORD"):  # SIGKILL this process once that item's record is written
    from omnitts.batch import ledger

    write, target = ledger.Ledger.write, os.environ["TEST_KILL_AFTER_RECORD"]

    def recording(self, record):
        write(self, record)
        if record["id"] == target:
            os.kill(os.getpid(), signal.SIGKILL)

    ledger.Ledger.write = recording
"""


def _synth(tmp_path, ckpt, out, *extra, kill_on=None, kill_after_record=None):
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(_KILLER)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": k, "text": t, "speaker": "ryan"}) + "\n" for k, t in TEXTS.items()))
    env = dict(os.environ, OMP_NUM_THREADS="1", TEST_KILL_ON=kill_on or "",
               TEST_KILL_AFTER_RECORD=kill_after_record or "",
               PYTHONPATH=os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "omnitts", "synth", str(manifest), "-m", str(ckpt), "-o", str(out), "--greedy",
           "--max-frames", "6", "--max-batch", "4", "--dtype", "float32", "--save-codes", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    return proc.returncode, " ".join(proc.stderr.split())


def _claims(out) -> dict:
    return {p.name[1:-len(CLAIM)]: json.loads(p.read_text()) for p in out.glob(f".*{CLAIM}")}


def test_an_item_that_kills_its_process_is_run_alone_then_recorded_failed(ckpt_dir, tmp_path):
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "out"
    code, err = _synth(tmp_path, ckpt, out, kill_on="b")
    assert code == -signal.SIGKILL, err
    running = {k for k, stamp in _claims(out).items() if stamp.get("running")}
    assert "b" in running and running <= set("abcd"), _claims(out)  # the first batch: a, b, c, d
    # The next run runs each of them alone: b kills its process again, alone this time.
    code, err = _synth(tmp_path, ckpt, out, kill_on="b")
    assert code == -signal.SIGKILL, err
    assert _claims(out)["b"]["alone"] is True and _claims(out)["b"]["deaths"] == 1
    # The third run records b failed without running it, and finishes the rest.
    code, err = _synth(tmp_path, ckpt, out, kill_on="b")
    assert code == 1, err
    message = ("the process running this item died twice while it ran, the last time alone (a crash, or the "
               "out-of-memory killer): it is not run again; --retry-failed tries it once more")
    assert f"error: b: {message}" in err
    records = read_results(out)
    assert {k: r["status"] for k, r in records.items()} == {**dict.fromkeys(TEXTS, "ok"), "b": "error"}
    assert records["b"]["error"] == message
    assert _claims(out) == {}  # every death record was consumed
    # Re-runs keep it failed (no loop); --retry-failed, with the cause gone, runs it.
    code, err = _synth(tmp_path, ckpt, out)
    assert code == 1 and "1 item failed in an earlier run" in err, err
    code, err = _synth(tmp_path, ckpt, out, "--retry-failed")
    assert code == 0, err
    assert all(r["status"] == "ok" for r in read_results(out).values())
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{k}.wav" for k in TEXTS] + [f"{k}.codes.npy" for k in TEXTS] + ["results.jsonl"])
    clean = tmp_path / "clean"
    assert _synth(tmp_path, ckpt, clean)[0] == 0
    for name in TEXTS:  # the items that ran alone have the codes of a clean run
        np.testing.assert_array_equal(np.load(out / f"{name}.codes.npy"), np.load(clean / f"{name}.codes.npy"))


def test_with_workers_one_command_pins_the_item_and_finishes_the_rest(ckpt_dir, tmp_path):
    """A worker killed by its item is started again; the item runs alone, kills that worker too, and is
    recorded failed by the next; every other item is done, in one command. The items were done before
    with another frame budget: each is counted "run again" once, however many workers took it up."""
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "out"
    assert _synth(tmp_path, ckpt, out, "--max-frames", "5")[0] == 0
    code, err = _synth(tmp_path, ckpt, out, "--workers", "2", kill_on="b")
    assert code == 1, err
    assert err.count("died: killed by SIGKILL; started again") == 2, err
    assert f"{len(TEXTS)} items run again: their line or the options changed" in err, err
    assert "the items it was running will run alone" in err
    records = read_results(out)
    assert {k: r["status"] for k, r in records.items()} == {**dict.fromkeys(TEXTS, "ok"), "b": "error"}
    assert records["b"]["error"].startswith("the process running this item died twice while it ran, the last time "
                                            "alone")
    assert _claims(out) == {} and not list(out.glob(".*.tmp"))


def test_a_worker_killed_between_a_record_and_its_report_has_that_record_counted(ckpt_dir, tmp_path):
    """The out-of-memory killer can strike after a worker wrote an item's record and before it told the
    parent: the record is in results.jsonl, so the parent counts it (done, run again) as that worker's,
    not as another writer's."""
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "out"
    assert _synth(tmp_path, ckpt, out, "--max-frames", "5")[0] == 0
    code, err = _synth(tmp_path, ckpt, out, "--workers", "2", kill_after_record="c")
    assert code == 0, err
    assert err.count("died: killed by SIGKILL; started again") == 1, err
    assert f"{len(TEXTS)} items run again: their line or the options changed" in err, err
    assert "other writers" not in err, err
    assert re.search(rf"│ {len(TEXTS)} │ 0 │ 0 │", err), err  # done, failed, skipped
    assert all(r["status"] == "ok" for r in read_results(out).values()) and len(read_results(out)) == len(TEXTS)


@pytest.mark.slow
def test_on_ray_one_command_pins_the_item_and_finishes_the_rest(ckpt_dir, tmp_path):
    """Ray retries the batch of an actor that died: its items run alone, the one that kills its actor alone
    too is recorded failed by the next attempt, and the batch (and the run) completes."""
    pytest.importorskip("ray.data", reason="Ray is not installed (pip install 'omnitts[ray]')")
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "out"
    code, err = _synth(tmp_path, ckpt, out, "--ray", "--workers", "1", kill_on="b")
    assert code == 1, err
    records = read_results(out)
    assert {k: r["status"] for k, r in records.items()} == {**dict.fromkeys(TEXTS, "ok"), "b": "error"}, err
    assert records["b"]["error"].startswith("the process running this item died twice")
    assert _claims(out) == {}
