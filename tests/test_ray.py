"""The Ray Data stage (`omnitts.ray`) and `omnitts synth --ray`, on a local two-CPU Ray cluster.

Skipped only when Ray is not installed and OMNITTS_REQUIRE_RAY is unset (CI sets it: there a missing Ray
fails). The cluster tests are in the slow tier: a Ray cluster and its actors' model loads take tens of
seconds on two cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from omnitts.cli import app

if os.environ.get("OMNITTS_REQUIRE_RAY") != "1":
    pytest.importorskip("ray.data", reason="Ray is not installed (pip install 'omnitts[ray]')")
import ray  # noqa: E402
import ray.data  # noqa: E402

from omnitts.ray import Synthesizer, row_schema, synthesize_dataset  # noqa: E402

runner = CliRunner()
SEEDED = [{"id": f"s{i:02d}", "text": f"Seeded sentence number {i}.", "speaker": "ryan", "seed": 100 + i}
          for i in range(8)]


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of two CPUs for this module's Python-API tests (the CLI test starts its own)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def _manifest(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _one_process(ckpt, tmp_path, rows, *flags) -> Path:
    """The rows synthesized by the normal single-process `omnitts synth` (with --save-codes)."""
    out = tmp_path / "one"
    result = runner.invoke(app, ["synth", str(_manifest(tmp_path / "one.jsonl", rows)), "-m", str(ckpt), "-o",
                                 str(out), "--max-frames", "8", "--dtype", "float32", "--save-codes", "--quiet",
                                 *flags])
    assert result.exit_code == 0, result.output
    return out


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _assert_clean(out: Path) -> None:
    """Nothing but finished files and the log: no temporaries, no claims, no live writer's lock.

    An actor Ray ends without closing its Batch (a killed one, or one Ray stops at the end) leaves its writer
    lock file, unlocked: the next writer of the directory deletes it, as `sweep` does here. So this sweeps
    (for up to 20 s, while Ray takes the actors down) and then nothing may be left: a live writer's lock, a
    temporary file or a claim of a live writer would survive it."""
    from omnitts.batch.claims import sweep

    deadline = time.time() + 20
    while True:
        sweep(out)
        names = sorted(p.name for p in out.iterdir())
        left = [n for n in names if n.startswith(".") or n.endswith((".tmp", ".claim", ".lock"))]
        if not left or time.time() > deadline:
            break
        time.sleep(0.2)
    assert not left, names


def _same_codes(one: Path, other: Path, ids) -> None:
    for item_id in ids:
        np.testing.assert_array_equal(np.load(other / f"{item_id}.codes.npy"), np.load(one / f"{item_id}.codes.npy"),
                                      err_msg=item_id)


@pytest.mark.slow
def test_two_actors_match_one_process_and_return_metadata_rows(cluster, ckpt_dir, tmp_path):
    ckpt = ckpt_dir("custom_voice")
    rows = [{"id": f"g{i:02d}", "text": f"Greedy sentence {i}, a little longer." * (1 + i % 3), "speaker": "ryan"}
            for i in range(10)]
    one = _one_process(ckpt, tmp_path, rows, "--greedy")
    out = tmp_path / "ray"
    ds = ray.data.from_items(rows + [{"id": "bad", "text": "Unknown voice.", "speaker": "nobody"}],
                             override_num_blocks=4)
    meta = synthesize_dataset(ds, ckpt, out, actors=2, batch_size=3, dtype="float32", greedy=True, max_frames=8,
                              save_codes=True)
    got = meta.take_all()
    assert sorted(r["id"] for r in got) == sorted([r["id"] for r in rows] + ["bad"])
    by_id = {r["id"]: r for r in got}
    recorded = {r["id"]: r for r in _records(out)}
    assert Counter(r["id"] for r in _records(out)) == Counter(list(by_id))  # every id written once
    for row in rows:
        meta_row, rec = by_id[row["id"]], recorded[row["id"]]
        assert meta_row["status"] == "ok" and not meta_row["skipped"] and meta_row["error"] is None
        for key in ("path", "seconds", "frames", "finish_reason", "seed"):
            assert meta_row[key] == rec[key], (row["id"], key)
        assert meta_row["path"] == f"{row['id']}.wav" and meta_row["frames"] == 8
    assert by_id["bad"]["status"] == "error" and "speaker" in by_id["bad"]["error"]
    assert recorded["bad"]["status"] == "error"
    _same_codes(one, out, [r["id"] for r in rows])
    _assert_clean(out)

    # Run again: nothing runs, every row comes back with its recorded metadata, marked skipped.
    again = {r["id"]: r for r in synthesize_dataset(ray.data.from_items(rows, override_num_blocks=2), ckpt, out,
                                                    actors=2, batch_size=5, dtype="float32", greedy=True,
                                                    max_frames=8, save_codes=True).take_all()}
    assert all(again[r["id"]]["skipped"] and again[r["id"]]["seconds"] == by_id[r["id"]]["seconds"] for r in rows)
    assert len(_records(out)) == len(rows) + 1


@pytest.mark.slow
def test_seeded_sampling_matches_one_process(cluster, ckpt_dir, tmp_path):
    ckpt = ckpt_dir("custom_voice")
    one = _one_process(ckpt, tmp_path, SEEDED)
    out = tmp_path / "ray"
    meta = synthesize_dataset(ray.data.from_items(SEEDED, override_num_blocks=4), ckpt, out, actors=2, batch_size=2,
                              dtype="float32", max_frames=8, save_codes=True)
    got = meta.take_all()
    assert sorted(r["seed"] for r in got) == [r["seed"] for r in SEEDED]
    _same_codes(one, out, [r["id"] for r in SEEDED])


def test_stage_maps_columns_and_turns_bad_rows_into_error_rows(ckpt_dir, tmp_path):
    """The stage's call alone (no cluster): column mapping, other columns ignored, bad rows as error rows."""
    import pyarrow as pa

    stage = Synthesizer(ckpt_dir("custom_voice"), tmp_path / "out", dtype="float32", greedy=True, max_frames=4,
                        columns={"id": "key", "text": "sentence"})
    batch = pa.table({"key": ["a", "b c", "a", None], "sentence": ["Hello there.", "x", "Again.", "No id."],
                      "speaker": ["ryan"] * 4, "score": [0.5, 1.0, 2.0, 3.0]})
    table = stage(batch)
    assert table.schema == row_schema()
    rows = table.to_pylist()
    assert [r["status"] for r in rows] == ["ok", "error", "error", "error"]
    assert "not a safe file name" in rows[1]["error"] and "already used" in rows[2]["error"]
    assert "id: missing (read from column 'key')" in rows[3]["error"]
    assert (tmp_path / "out" / "a.wav").is_file()
    stage.close()


def test_a_bad_row_with_a_whole_float_id_takes_that_id_as_a_good_row_would(ckpt_dir, tmp_path):
    """A pandas integer id column with gaps holds floats (7.0): a good row's is the id "7", so a bad row's is too:
    recorded under it, and a later row with it is a duplicate, as in a manifest. The bad row was an error row
    without an id, unrecorded, and the later row ran as "7"."""
    import pyarrow as pa

    stage = Synthesizer(ckpt_dir("custom_voice"), tmp_path / "out", dtype="float32", greedy=True, max_frames=4)
    batch = pa.table({"id": [7.0, 8.0, 7.0], "text": ["Hi.", "Yo.", "Again."], "speaker": ["nobody", "ryan", "ryan"]})
    rows = stage(batch).to_pylist()
    stage.close()
    assert [(r["id"], r["status"]) for r in rows] == [("7", "error"), ("8", "ok"), (None, "error")], rows
    assert "'7' already used" in rows[2]["error"]
    assert [(r["id"], r["status"]) for r in _records(tmp_path / "out")] == [("7", "error"), ("8", "ok")]
    assert not (tmp_path / "out" / "7.wav").exists()



def test_stage_takes_ids_alike_but_for_case_as_one_file_where_the_filesystem_folds_case(ckpt_dir, tmp_path,
                                                                                          monkeypatch):
    """On a case-insensitive OUT (macOS, Windows, SMB; probed once, patched here) `Alice` and `alice` are one
    file: the later row is an error row naming the earlier, as a manifest's line is, and nothing is
    overwritten. On a case-sensitive one both run."""
    import pyarrow as pa

    from omnitts.batch import folder

    rows = [{"id": i, "text": f"Sentence {n}.", "speaker": "ryan"} for n, i in enumerate(("Alice", "alice", "bob"))]
    monkeypatch.setattr(folder, "folds_case", lambda path: True)
    stage = Synthesizer(ckpt_dir("custom_voice"), tmp_path / "folded", dtype="float32", greedy=True, max_frames=4)
    got = stage(pa.Table.from_pylist(rows)).to_pylist()
    stage.close()
    assert [r["status"] for r in got] == ["ok", "error", "ok"], got
    assert "'alice' names the same file as another row's 'Alice' on this case-insensitive filesystem" in got[1]["error"]
    assert [r["id"] for r in _records(tmp_path / "folded")] == ["Alice", "bob"]

    monkeypatch.setattr(folder, "folds_case", lambda path: False)
    stage = Synthesizer(ckpt_dir("custom_voice"), tmp_path / "plain", dtype="float32", greedy=True, max_frames=4)
    assert [r["status"] for r in stage(pa.Table.from_pylist(rows)).to_pylist()] == ["ok"] * 3
    stage.close()


def test_stage_tells_a_row_run_again_for_a_damaged_file_from_a_changed_row(ckpt_dir, tmp_path):
    """The stage's call alone (no cluster): a row whose file was damaged is run again and marked `damaged` (not
    `changed`), as the one-process run counts it; a row whose text changed is marked `changed`."""
    import pyarrow as pa

    out = tmp_path / "out"
    rows = [{"id": i, "text": f"Sentence {i}.", "speaker": "ryan"} for i in ("kept", "broken", "edited")]
    stage = Synthesizer(ckpt_dir("custom_voice"), out, dtype="float32", greedy=True, max_frames=4)
    assert [r["status"] for r in stage(pa.Table.from_pylist(rows)).to_pylist()] == ["ok"] * 3
    stage.close()
    (out / "broken.wav").write_bytes(b"truncated")
    rows[2]["text"] = "Changed."
    stage = Synthesizer(ckpt_dir("custom_voice"), out, dtype="float32", greedy=True, max_frames=4)  # the next run
    got = {r["id"]: r for r in stage(pa.Table.from_pylist(rows)).to_pylist()}
    flags = {i: (r["status"], r["skipped"], r["changed"], r["damaged"]) for i, r in got.items()}
    assert flags == {"kept": ("ok", True, False, False), "broken": ("ok", False, False, True),
                     "edited": ("ok", False, True, False)}, flags
    assert [r["id"] for r in _records(out)] == ["kept", "broken", "edited", "broken", "edited"]
    assert stage.batch.tally.changed == 2 and stage.batch.tally.damaged == 1  # the actor's own count agrees
    stage.close()

def test_an_id_used_again_in_a_later_batch_of_the_run_is_an_error_row(ckpt_dir, tmp_path):
    """Ids are unique across a dataset: a row whose id this run recorded from another row, in an earlier batch
    of the stage or by another actor of the run, is an error row and replaces nothing (its audio and record
    stay the first row's); the same row again (what a batch Ray retried holds) gets that row's metadata, as
    run by this run."""
    import pyarrow as pa

    out, ckpt = tmp_path / "out", ckpt_dir("custom_voice")
    stage = Synthesizer(ckpt, out, dtype="float32", greedy=True, max_frames=4)
    other = Synthesizer(ckpt, out, dtype="float32", greedy=True, max_frames=4)  # another actor of the run
    first = {"id": "a", "text": "The first row.", "speaker": "ryan"}
    assert stage(pa.Table.from_pylist([first])).to_pylist()[0]["status"] == "ok"
    audio = (out / "a.wav").read_bytes()
    for actor in (stage, other):
        got = actor(pa.Table.from_pylist([{**first, "text": "Another row, same id."}])).to_pylist()
        assert got[0]["status"] == "error" and got[0]["id"] is None, got
        assert "id: 'a' already used by another row of this run (in another batch)" in got[0]["error"]
        got = actor(pa.Table.from_pylist([first])).to_pylist()
        assert _flags(got) == {"a": ("ok", False, False, False)} and got[0]["path"] == "a.wav"  # not skipped
    assert (out / "a.wav").read_bytes() == audio
    assert [r["id"] for r in _records(out)] == ["a"]
    stage.close()
    other.close()


def test_stage_paths_may_start_with_a_tilde(ckpt_dir, tmp_path, monkeypatch):
    """`~` is the home folder in the stage's model and out, as in every path omnitts takes: out was taken
    literally (a folder named `~` in the current directory got the audio), and model was not found."""
    import pyarrow as pa

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    (home / "ckpt").symlink_to(ckpt_dir("custom_voice"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    stage = Synthesizer("~/ckpt", "~/out", dtype="float32", greedy=True, max_frames=2)
    assert stage(pa.Table.from_pylist([{"id": "a", "text": "Hi.", "speaker": "ryan"}])).to_pylist()[0]["status"] == "ok"
    stage.close()
    assert (home / "out" / "a.wav").is_file() and not (cwd / "~").exists()


@pytest.mark.parametrize("option, value, message", [
    ("greedy", "no", "greedy: expected a bool, got str"), ("force", 1, "force: expected a bool"),
    ("format", "mp3", "format: 'mp3'; choose one of wav, flac, ogg"), ("loudness", 5.0, "loudness: 5.0; choose a level"),
    ("loudness", "x", "loudness: 'x'"), ("split_chars", -5, "split_chars: -5; expected an integer >= 0"),
    ("retry_runaway", -1, "retry_runaway: -1"), ("since", "0", "since: '0'"), ("columns", {"nope": "x"}, "columns:"),
    ("max_frames", 0, "max_frames: must be >= 1"), ("seed", "3", "seed: expected an int"),
    ("env", {"OMP_NUM_THREADS": 1}, "env: {'OMP_NUM_THREADS': 1}; expected {variable: value}, both strings")])
def test_stage_options_are_checked_before_the_model_loads(tmp_path, monkeypatch, option, value, message):
    """The stage's own options are checked as `omnitts synth` checks its flags, naming the option, before the model
    loads: a truthy greedy="no" decoded greedily, a loudness above 0 LUFS was aimed at, a bad format or
    split_chars failed every batch or row."""
    import omnitts.api

    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        Synthesizer(tmp_path / "ckpt", tmp_path / "out", **{option: value})


def test_synthesize_dataset_checks_its_arguments_before_any_actor_starts():
    """actors of another type, a bad stage option or an unknown keyword: one error naming it, from the driver (they
    were a TypeError from a comparison, or an error in every actor as it started)."""
    from omnitts.errors import OmniTTSError

    with pytest.raises(OmniTTSError, match=re.escape("actors: '2'; at least 1")):
        synthesize_dataset(None, "ckpt", "out", actors="2")
    with pytest.raises(TypeError, match="greedy: expected a bool"):
        synthesize_dataset(None, "ckpt", "out", greedy="no")
    with pytest.raises(TypeError, match="max_frame"):
        synthesize_dataset(None, "ckpt", "out", max_frame=5)


def test_synthesize_dataset_takes_numpy_integers_for_actors(tmp_path):
    """actors=np.int64(2) (a count from numpy) was refused with "actors: np.int64(2); at least 1"."""
    import numpy as np
    from types import SimpleNamespace

    ds = SimpleNamespace(map_batches=lambda fn, **options: options)  # what the stage asks Ray for, no cluster
    options = synthesize_dataset(ds, tmp_path / "ckpt", tmp_path / "out", actors=np.int64(2))
    assert options["compute"].max_size == 2 and type(options["compute"].max_size) is int


def test_synthesize_dataset_of_no_ray_dataset_says_what_it_takes(ckpt_dir, tmp_path):
    """A list of rows or a DataFrame (what `TTS.stream` takes) was "AttributeError: 'list' object has no attribute
    'map_batches'"; a TypeError names the argument and how to make a Ray dataset of them."""
    import pandas as pd

    for ds, kind in (([{"id": "a", "text": "Hi.", "speaker": "ryan"}], "list"), (pd.DataFrame({"id": ["a"]}), "DataFrame"),
                     (None, "NoneType")):
        with pytest.raises(TypeError, match=rf"^ds: expected a Ray Dataset \(ray.data.read_json\(path\), "
                                            rf"ray.data.from_items\(rows\), ray.data.from_pandas\(df\)\), got {kind}$"):
            synthesize_dataset(ds, ckpt_dir("custom_voice"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_synthesize_dataset_gives_every_actor_the_runs_start(ckpt_dir, tmp_path):
    """Every actor's `since` is where the log ended as `synthesize_dataset` was called: each took its own start,
    so an actor started late took the others' records of this run for an earlier run's (a `force` redid them, a
    different row with one of their ids replaced it). An explicit `since` is kept."""
    class Stage:  # stands in for a Ray dataset: what the stage would be built with
        def map_batches(self, fn, fn_constructor_kwargs, **options):
            return fn_constructor_kwargs

    out, ckpt = tmp_path / "out", ckpt_dir("custom_voice")
    assert synthesize_dataset(Stage(), ckpt, out)["since"] == 0  # no log yet: all it will hold is this run's
    out.mkdir()
    (out / "results.jsonl").write_text('{"id": "a", "status": "error", "error": "x"}\n')
    assert synthesize_dataset(Stage(), ckpt, out, force=True)["since"] == (out / "results.jsonl").stat().st_size
    assert synthesize_dataset(Stage(), ckpt, out, since=3)["since"] == 3


def _flags(rows: list[dict]) -> dict:
    return {r["id"]: (r["status"], r["skipped"], r["changed"], r["damaged"]) for r in rows}


def test_a_retried_batch_reports_the_rows_its_dead_attempt_ran_as_run_by_this_run(ckpt_dir, tmp_path):
    """Ray retries a batch on a new actor after its actor died: the rows the dead attempt finished are not run
    again, but they were run by this run, so they are not `skipped`, and a row run again over an earlier run's
    record says why (`changed` / `damaged`) as the dead attempt would have; the command's summary counts them
    as a run without deaths does. Two stages with the same `since` stand in for the two attempts."""
    import pyarrow as pa
    from rich.console import Console

    from omnitts.batch.ledger import Ledger
    from omnitts.batch.tally import Tally
    from omnitts.cli.running import _count_row

    out, ckpt = tmp_path / "out", ckpt_dir("custom_voice")
    rows = [{"id": i, "text": f"Sentence {i}.", "speaker": "ryan"} for i in ("kept", "broken", "edited", "new")]
    earlier = Synthesizer(ckpt, out, dtype="float32", greedy=True, max_frames=4)
    assert [r["status"] for r in earlier(pa.Table.from_pylist(rows[:3])).to_pylist()] == ["ok"] * 3
    earlier.close()
    (out / "broken.wav").write_bytes(b"truncated")
    rows[2]["text"] = "Changed."
    since = (out / "results.jsonl").stat().st_size  # where this run begins
    before = Ledger(out)

    dead = Synthesizer(ckpt, out, dtype="float32", greedy=True, max_frames=4, since=since)
    first = dead(pa.Table.from_pylist(rows)).to_pylist()  # its rows never reach the driver: the actor died
    dead.close()
    retry = Synthesizer(ckpt, out, dtype="float32", greedy=True, max_frames=4, since=since)
    got = retry(pa.Table.from_pylist(rows)).to_pylist()
    retry.close()
    assert _flags(got) == _flags(first) == {"kept": ("ok", True, False, False), "broken": ("ok", False, False, True),
                                          "edited": ("ok", False, True, False), "new": ("ok", False, False, False)}
    assert [r["id"] for r in _records(out)] == ["kept", "broken", "edited", "broken", "edited", "new"]  # none twice

    tally = Tally()
    for row in got:
        _count_row(row, before, tally, Console(quiet=True))
    assert (tally.skipped, tally.done, tally.changed, tally.damaged) == (1, 3, 2, 1)

    # --force: every row is run once by the run; the retry reports the dead attempt's rows as run, not redone
    since = (out / "results.jsonl").stat().st_size
    dead = Synthesizer(ckpt, out, dtype="float32", greedy=True, max_frames=4, since=since, force=True)
    dead(pa.Table.from_pylist(rows[:2]))
    dead.close()
    retry = Synthesizer(ckpt, out, dtype="float32", greedy=True, max_frames=4, since=since, force=True)
    assert _flags(retry(pa.Table.from_pylist(rows[:2])).to_pylist()) == {"kept": ("ok", False, False, False),
                                                                         "broken": ("ok", False, False, False)}
    retry.close()
    assert len(_records(out)) == 8


def test_a_row_another_command_recorded_during_the_run_is_skipped_and_counted_as_theirs(ckpt_dir, tmp_path):
    """Another command writing the same OUT during a `--ray` run records one of its rows: this run's actors
    skip it (as any writer does) and report it `skipped`, and the summary counts it as another writer's, not
    as done by this run; what this run's own dead attempt recorded is still this run's. The records carry
    the run's token, which tells the two apart (before, every record after `since` was taken for this run's,
    so the done count and the speed included the other command's work)."""
    import pyarrow as pa
    from rich.console import Console

    from omnitts.batch.ledger import Ledger
    from omnitts.batch.tally import Tally
    from omnitts.cli.running import _count_row

    out, ckpt = tmp_path / "out", ckpt_dir("custom_voice")
    rows = [{"id": i, "text": f"Sentence {i}.", "speaker": "ryan"} for i in ("kept", "theirs", "ours", "new")]
    opts = dict(dtype="float32", greedy=True, max_frames=4)
    earlier = Synthesizer(ckpt, out, **opts)
    earlier(pa.Table.from_pylist(rows[:1]))
    earlier.close()
    since = (out / "results.jsonl").stat().st_size
    driver = Ledger(out, run="this-run")  # the driver's, opened where the run begins

    other = Synthesizer(ckpt, out, **opts)  # another command: a run of its own
    other(pa.Table.from_pylist(rows[1:2]))
    other.close()
    dead = Synthesizer(ckpt, out, **opts, since=since, run="this-run")  # an attempt whose actor died
    dead(pa.Table.from_pylist(rows[2:3]))
    dead.close()
    retry = Synthesizer(ckpt, out, **opts, since=since, run="this-run")
    got = retry(pa.Table.from_pylist(rows)).to_pylist()
    retry.close()
    assert _flags(got) == {"kept": ("ok", True, False, False), "theirs": ("ok", True, False, False),
                           "ours": ("ok", False, False, False), "new": ("ok", False, False, False)}
    assert [r["id"] for r in _records(out)] == ["kept", "theirs", "ours", "new"]  # none run twice
    runs = {r["id"]: r["run"] for r in _records(out)}
    assert runs["ours"] == runs["new"] == "this-run" and len({runs["kept"], runs["theirs"], "this-run"}) == 3

    tally = Tally()
    driver.refresh()
    for row in got:
        _count_row(row, driver, tally, Console(quiet=True))
    assert (tally.skipped, tally.others, tally.done, tally.failed) == (1, 1, 2, 0)


def test_synthesize_dataset_gives_every_actor_one_run_token(ckpt_dir, tmp_path):
    """Every actor gets the same `run` (made once by `synthesize_dataset`), a new one for each call; a given one is
    kept, and one that is not a token is refused before any actor starts."""
    class Stage:
        def map_batches(self, fn, fn_constructor_kwargs, **options):
            return fn_constructor_kwargs

    ckpt = ckpt_dir("custom_voice")
    first, second = (synthesize_dataset(Stage(), ckpt, tmp_path / "out")["run"] for _ in range(2))
    assert isinstance(first, str) and len(first) == 16 and first != second
    assert synthesize_dataset(Stage(), ckpt, tmp_path / "out", run="mine")["run"] == "mine"
    for bad in ("", "  ", 7):
        with pytest.raises(ValueError, match=r"^run: .*expected a token"):
            synthesize_dataset(Stage(), ckpt, tmp_path / "out", run=bad)


def _actor_pids() -> list[int]:
    """Processes of the stage's Ray actors (Ray titles them ray::MapWorker(MapBatches(Synthesizer)))."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"MapBatches(Synthesizer)" in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.slow
def test_an_actor_killed_mid_run_leaves_every_id_exactly_once(cluster, ckpt_dir, tmp_path):
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "ray"
    rows = [{"id": f"k{i:02d}", "text": f"Sentence {i} of the kill test.", "speaker": "ryan"} for i in range(24)]
    killed = []

    def kill_one_when_some_are_done():
        deadline = time.time() + 300
        while time.time() < deadline:
            log = out / "results.jsonl"
            if log.exists() and len(log.read_text().splitlines()) >= 3 and _actor_pids():
                pid = _actor_pids()[0]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_one_when_some_are_done, daemon=True)
    watcher.start()
    meta = synthesize_dataset(ray.data.from_items(rows, override_num_blocks=8), ckpt, out, actors=2, batch_size=3,
                              dtype="float32", greedy=True, max_frames=12)
    got = meta.take_all()
    watcher.join()
    assert killed, "no actor was killed: the run ended first"
    assert sorted(r["id"] for r in got) == [r["id"] for r in rows]  # one metadata row per id
    assert all(r["status"] == "ok" for r in got)
    counts = Counter(r["id"] for r in _records(out))
    assert counts == Counter(r["id"] for r in rows), counts  # every id recorded exactly once
    assert all((out / f"{r['id']}.wav").is_file() for r in rows)
    _assert_clean(out)


@pytest.mark.slow
def test_cli_ray_end_to_end(ckpt_dir, tmp_path):
    """`omnitts synth --ray` in its own process (it starts a local cluster): the same audio codes as the
    one-process path, the same summary and exit code, bad lines reported and recorded once."""
    ckpt = ckpt_dir("custom_voice")
    one = _one_process(ckpt, tmp_path, SEEDED)
    manifest = _manifest(tmp_path / "m.jsonl", SEEDED + [{"id": "bad", "text": "Who?", "speaker": "nobody"}])
    out = tmp_path / "ray"
    cmd = [sys.executable, "-m", "omnitts", "synth", str(manifest), "-m", str(ckpt), "-o", str(out), "--ray",
           "--workers", "2", "--max-frames", "8", "--dtype", "float32", "--save-codes"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr  # the bad line has no audio
    assert "speaker: 'nobody'" in proc.stderr and "omnitts synth ->" in proc.stderr
    assert "Starting execution" not in proc.stderr  # Ray's own logging stays quiet
    assert "ray: 2 actors" in proc.stderr, proc.stderr
    _same_codes(one, out, [r["id"] for r in SEEDED])
    assert Counter(r["id"] for r in _records(out)) == Counter([r["id"] for r in SEEDED] + ["bad"])
    _assert_clean(out)

    # The same command again: every item already done, only the bad line still failing; Ray is not started.
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr
    assert f"{len(SEEDED)} items already done" in proc.stderr, proc.stderr
    assert "ray: 2 actors" not in proc.stderr, proc.stderr
    assert len(_records(out)) == len(SEEDED) + 1

    # --force: every item redone exactly once by the actors together (each a writer that started after
    # the run began: the run's start in results.jsonl tells them what this run already did)
    proc = subprocess.run(cmd + ["--force"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr
    forced = Counter(r["id"] for r in _records(out)[len(SEEDED) + 1:])
    assert forced == Counter([r["id"] for r in SEEDED]), forced  # the bad line stays recorded once
    _same_codes(one, out, [r["id"] for r in SEEDED])
    _assert_clean(out)


@pytest.mark.slow
def test_cli_ray_stopped_by_sigterm_exits_143_as_every_run_does(ckpt_dir, tmp_path):
    """A scheduler's SIGTERM to `omnitts synth --ray` stops it as it stops a run without Ray: the interrupted line
    and exit code 143. ray.init had taken SIGTERM over: the command exited 15 after a stack dump of Ray's."""
    rows = [{"id": f"t{i:02d}", "text": f"Sentence {i} of the stop test.", "speaker": "ryan"} for i in range(32)]
    out = tmp_path / "ray"
    cmd = [sys.executable, "-m", "omnitts", "synth", str(_manifest(tmp_path / "m.jsonl", rows)), "-m",
           str(ckpt_dir("custom_voice")), "-o", str(out), "--ray", "--max-frames", "40", "--dtype", "float32"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + 300
    while not ((out / "results.jsonl").exists() and (out / "results.jsonl").read_text()) and time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read()  # the run ended before any item was recorded
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 143, err
    assert "SIGTERM received" not in err and f"interrupted: finished items are recorded in {out}" in err, err
    assert max(Counter(r["id"] for r in _records(out)).values()) == 1
    from omnitts.batch.claims import CLAIM, deaths_in

    # Ray took the actors down mid-item: the stop's doing, so no item carries a death into the next run
    deaths = {p.name: deaths_in(json.loads(p.read_text())) for p in out.glob(f".*{CLAIM}")}
    assert not any(count for count, _ in deaths.values()), deaths


@pytest.mark.slow
def test_cli_ray_counts_a_damaged_file_as_the_one_process_run_does(ckpt_dir, tmp_path):
    """`omnitts synth --ray` over an earlier run's directory: a file damaged since (its record says done) and a
    changed line both run again, and the summary tells them apart as the one-process summary does."""
    ckpt = ckpt_dir("custom_voice")
    rows = [{"id": f"u{i}", "text": f"Utterance number {i}.", "speaker": "ryan"} for i in range(3)]
    out = _one_process(ckpt, tmp_path, rows)  # the earlier run, with the options the --ray run uses
    (out / "u1.wav").write_bytes(b"truncated")
    manifest = _manifest(tmp_path / "m.jsonl", [rows[0], rows[1], {**rows[2], "text": "Changed."}])
    cmd = [sys.executable, "-m", "omnitts", "synth", str(manifest), "-m", str(ckpt), "-o", str(out), "--ray",
           "--max-frames", "8", "--dtype", "float32", "--save-codes"]
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200")
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    err = " ".join(proc.stderr.split())  # the console wraps long lines
    assert ("2 items run again: 1 with the line or the options changed since the earlier run, 1 with the file "
            "damaged or missing (each file replaced)") in err, err
    assert "1 item already done" in err, err
    assert [r["id"] for r in _records(out)] == ["u0", "u1", "u2", "u1", "u2"]
    _assert_clean(out)

def test_ray_options_are_checked_before_anything_loads(ckpt_dir, tmp_path, monkeypatch):
    manifest = _manifest(tmp_path / "m.jsonl", SEEDED[:1])
    base = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "out")]
    result = runner.invoke(app, base + ["--ray-address", "auto"])
    assert result.exit_code == 2 and "--ray-address goes with --ray" in result.output
    result = runner.invoke(app, base + ["--ray", "--devices", "cpu,cpu"])
    assert result.exit_code == 2 and "--devices does not go with --ray" in result.output
    result = runner.invoke(app, base + ["--ray", "--workers", "0"])
    assert result.exit_code == 2 and "--workers 0: give 1 or more" in result.output
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    result = runner.invoke(app, base + ["--ray"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == "error: --ray needs Ray: pip install 'omnitts[ray]'"


def test_ray_address_without_a_cluster_says_so_not_that_out_cannot_be_written(ckpt_dir, tmp_path, monkeypatch):
    """ray.init's ConnectionError (no cluster at --ray-address) is an OSError: it was reported as 'cannot write
    OUT: Could not find any running Ray instance...'."""
    def no_cluster(*args, **kwargs):
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to.")

    monkeypatch.setattr(ray, "init", no_cluster)
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(_manifest(tmp_path / "m.jsonl", SEEDED[:1])), "-m",
                                 str(ckpt_dir("custom_voice")), "-o", str(out), "--ray", "--ray-address", "auto"])
    assert result.exit_code == 1, result.output
    line = " ".join(result.output.split())
    assert "error: --ray-address auto: cannot join the Ray cluster (Could not find any running Ray instance" in line
    assert "cannot write" not in line, line


def test_a_ray_address_where_nothing_answers_is_refused_before_anything_runs(ckpt_dir, tmp_path, monkeypatch):
    """ray.init retried a dead --ray-address for minutes (a refusing port: without end), flooding stderr; the
    address is tried first, for a few seconds, and the run refused in one line, exit 2, OUT not made."""
    import socket

    from omnitts.cli.checks import unanswered

    def never(*args, **kwargs):
        raise AssertionError("ray.init was called")

    monkeypatch.setattr(ray, "init", never)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert unanswered(f"127.0.0.1:{port}") is None and unanswered(f"ray://127.0.0.1:{port}") is None
    assert unanswered("auto") is None and unanswered("local") is None  # no host and port to try
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(_manifest(tmp_path / "m.jsonl", SEEDED[:1])), "-m",
                                 str(ckpt_dir("custom_voice")), "-o", str(out), "--ray", "--ray-address",
                                 f"127.0.0.1:{port}"])
    assert result.exit_code == 2, result.output
    assert " ".join(result.output.split()) == (f"error: --ray-address 127.0.0.1:{port}: cannot join the Ray cluster "
                                               f"(nothing answers at 127.0.0.1:{port}: Connection refused); nothing "
                                               "was run")
    assert not out.exists()
