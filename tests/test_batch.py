"""The manifest run: records, runaway retries, dataset export, graceful stop, lazy pipeline."""

from __future__ import annotations

import json
import re
from contextlib import contextmanager

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from omnitts.cli import app
from omnitts.engine.pipeline import Job, Pipeline
from omnitts.errors import OmniTTSError, RequestError
from omnitts.params import derive_seed, share_frames
from omnitts.request import Request

runner = CliRunner()


def _manifest(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_records_carry_timings_seed_attempts_and_pieces(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Timed.", "speaker": "ryan"}])
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                 "--max-frames", "3", "-q"])
    assert result.exit_code == 0, result.output
    (rec,) = _records(out)
    assert rec["attempts"] == 1 and rec["pieces"] == 1
    assert isinstance(rec["seed"], int)  # sampling without --seed: a seed is drawn and recorded
    assert set(rec["timings"]) == {"prepare", "generate", "decode", "total"}
    assert all(v >= 0 for v in rec["timings"].values()) and rec["timings"]["total"] >= rec["timings"]["decode"]


def test_recorded_seed_reproduces_the_item(tts_factory, ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Reproduce me.", "speaker": "ryan"}])
    out = tmp_path / "out"
    runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                        "--max-frames", "5", "--save-codes", "-q"])
    seed = _records(out)[0]["seed"]
    tts = tts_factory("custom_voice")
    again = tts.synthesize("Reproduce me.", speaker="ryan", seed=seed, max_frames=5)
    assert np.array_equal(again.codes, np.load(out / "a.codes.npy"))


def test_retry_runaway_reruns_with_derived_seeds(tts_factory, ckpt_dir, tmp_path):
    # The tiny checkpoint never says EOS, so every sampled item exhausts its derived budget.
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "run", "text": "Hi.", "speaker": "ryan", "seed": 7},
        {"id": "capped", "text": "Hi.", "speaker": "ryan", "seed": 7, "max_seconds": 0.4},  # explicit: no retry
    ])
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                 "--retry-runaway", "2", "--save-codes", "-q"])
    assert result.exit_code == 0, result.output
    recs = {r["id"]: r for r in _records(out)}
    assert recs["run"]["attempts"] == 3 and recs["run"]["finish_reason"] == "length"
    assert recs["capped"]["attempts"] == 1 and recs["capped"]["frames"] == 5
    # `seed` is the item's (rerunning the line reproduces everything); `seeds` made the audio kept.
    assert recs["run"]["seed"] == 7 and recs["run"]["seeds"] == [derive_seed(7, "retry", 2)]
    assert recs["capped"]["seed"] == 7 and recs["capped"]["seeds"] == [7]
    # The kept attempt is the second retry: the item's seed derived twice over, nothing else.
    tts = tts_factory("custom_voice")
    expected = tts.synthesize("Hi.", speaker="ryan", seed=derive_seed(7, "retry", 2))
    assert np.array_equal(np.load(out / "run.codes.npy"), expected.codes)
    assert recs["run"]["frames"] == expected.frames


def test_retry_runaway_on_a_rerun_retries_the_runaways_recorded_without_it(ckpt_dir, tmp_path):
    """A run without --retry-runaway leaves runaways (finish "length" on a derived budget); the same command with
    --retry-runaway 2 skipped them all as done. Now it retries exactly those, as with the flag from the start; an
    item with its own budget, and one retried as far as the flag allows, are skipped."""
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "run", "text": "Hi.", "speaker": "ryan", "seed": 7},
        {"id": "capped", "text": "Hi.", "speaker": "ryan", "seed": 7, "max_seconds": 0.4},
    ])
    out = tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "-q"]
    assert runner.invoke(app, args).exit_code == 0
    assert {r["id"]: (r["attempts"], r["finish_reason"]) for r in _records(out)} == {
        "run": (1, "length"), "capped": (1, "length")}
    result = runner.invoke(app, args + ["--retry-runaway", "2"])
    assert result.exit_code == 0, result.output
    last = _records(out)[-1]
    assert len(_records(out)) == 3 and (last["id"], last["attempts"]) == ("run", 3)
    assert last["seeds"] == [derive_seed(7, "retry", 2)]
    assert "1 item run again: its line or the options changed" in result.output
    for retries in ("2", "1"):  # retried as far as asked: done
        assert runner.invoke(app, args + ["--retry-runaway", retries]).exit_code == 0
    assert len(_records(out)) == 3


def test_export_dataset_has_an_audio_column_in_manifest_order(ckpt_dir, tmp_path):
    import io

    import datasets

    rows = [{"id": f"u{i}", "text": f"Line {i}.", "speaker": "ryan"} for i in range(3)]
    manifest = _manifest(tmp_path / "m.jsonl", rows)
    out, export = tmp_path / "out", tmp_path / "ds"
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                 "--max-frames", "3", "--export-dataset", str(export), "-q"])
    assert result.exit_code == 0, result.output
    dataset = datasets.load_from_disk(str(export))
    first = dataset[0]  # the documented one-liner: no audio decoder (torchcodec) needed
    assert first["id"] == "u0" and set(first["audio"]) == {"bytes", "path"} and first["audio"]["path"] == "u0.wav"
    samples, rate = sf.read(io.BytesIO(first["audio"]["bytes"]))  # how docs/outputs.md says to decode
    assert rate == 24000 and np.array_equal(samples, sf.read(out / "u0.wav")[0])
    assert dataset.features["audio"].sampling_rate == 24000
    assert dataset["id"] == ["u0", "u1", "u2"] and dataset["text"] == ["Line 0.", "Line 1.", "Line 2."]
    assert dataset["speaker"] == ["ryan"] * 3 and dataset["instruct"] == [None] * 3  # absent is null, not ''
    for row in dataset:
        assert row["audio"]["bytes"] == (out / f"{row['id']}.wav").read_bytes()
        assert row["frames"] == 3
    assert not (export / ".build").exists()


def _fail_prepare_of(monkeypatch, item_id):
    """Make TTS.prepare fail for one id (until monkeypatch.undo)."""
    from omnitts.api import TTS
    from omnitts.errors import RequestError

    real = TTS.prepare

    def prepare(self, request):
        if request.id == item_id:
            raise RequestError("text: refused by the test")
        return real(self, request)

    monkeypatch.setattr(TTS, "prepare", prepare)


def test_a_retried_item_appends_a_line_and_every_reader_takes_the_last(ckpt_dir, tmp_path, monkeypatch):
    """Append-only log, last record of an id wins: for resume, --retry-failed, the export and read_results."""
    import datasets

    import omnitts

    rows = [{"id": k, "text": f"Line {k}.", "speaker": "ryan"} for k in ("a", "b", "c")]
    manifest = _manifest(tmp_path / "m.jsonl", rows)
    out, export = tmp_path / "out", tmp_path / "ds"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "3",
            "--export-dataset", str(export), "-q"]
    _fail_prepare_of(monkeypatch, "b")
    assert runner.invoke(app, args).exit_code == 1
    assert datasets.load_from_disk(str(export))["id"] == ["a", "c"]  # partly failed: the done items only
    monkeypatch.undo()
    runner.invoke(app, args)  # without --retry-failed the failure stands: nothing runs, nothing is appended
    assert sorted((r["id"], r["status"]) for r in _records(out)) == [("a", "ok"), ("b", "error"), ("c", "ok")]
    assert runner.invoke(app, args + ["--retry-failed"]).exit_code == 0
    lines = _records(out)
    assert len(lines) == 4 and (lines[-1]["id"], lines[-1]["status"]) == ("b", "ok")
    last = omnitts.read_results(out)  # the Python API's reader of an output directory
    assert sorted(last) == ["a", "b", "c"] and last["b"] == lines[-1]
    dataset = datasets.load_from_disk(str(export))  # resumed: rows for all three, b's from its ok record
    assert dataset["id"] == ["a", "b", "c"]
    b = dataset[1]
    assert (b["frames"], b["seed"], b["audio"]["bytes"]) == (3, last["b"]["seed"], (out / "b.wav").read_bytes())
    assert b["seconds"] == pytest.approx(last["b"]["seconds"])
    assert runner.invoke(app, args + ["--retry-failed"]).exit_code == 0  # all done: nothing runs, nothing appended
    assert len(_records(out)) == 4


def test_an_item_run_again_leaves_no_file_of_its_earlier_version(ckpt_dir, tmp_path):
    """Run 1 writes a.wav and a.codes.npy (seed 1); run 2 (seed 2, flac, no --save-codes) redoes it: the
    earlier wav and, above all, codes that are no longer the audio's codes are gone once run 2's record is
    written. A run that skips the item leaves its files alone."""
    rows = [{"id": "a", "text": "Hi.", "speaker": "ryan"}, {"id": "b", "text": "Hello.", "speaker": "ryan"}]
    manifest, out = _manifest(tmp_path / "m.jsonl", rows), tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "3", "-q"]
    assert runner.invoke(app, args + ["--seed", "1", "--save-codes"]).exit_code == 0
    files = lambda: sorted(p.name for p in out.iterdir())  # noqa: E731
    assert files() == ["a.codes.npy", "a.wav", "b.codes.npy", "b.wav", "results.jsonl"]
    assert runner.invoke(app, args + ["--seed", "2", "--format", "flac"]).exit_code == 0
    assert files() == ["a.flac", "b.flac", "results.jsonl"]
    assert [r["path"] for r in _records(out)[-2:]] == ["a.flac", "b.flac"]
    assert runner.invoke(app, args + ["--seed", "2", "--format", "flac", "--save-codes"]).exit_code == 0
    assert files() == ["a.codes.npy", "a.flac", "b.codes.npy", "b.flac", "results.jsonl"]  # a new option: run again


def test_only_files_an_earlier_record_named_are_dropped(ckpt_dir, tmp_path, monkeypatch):
    """A user's own a.wav and a.codes.npy in OUT are not an earlier version of item a (no record named them):
    writing a as flac keeps them. b's flac, named by its record, goes when b is written as ogg, even with a
    failed attempt between; a's flac goes, a.wav and a.codes.npy stay."""
    rows = [{"id": "a", "text": "Hi.", "speaker": "ryan"}, {"id": "b", "text": "Hello.", "speaker": "ryan"}]
    manifest, out = _manifest(tmp_path / "m.jsonl", rows), tmp_path / "out"
    out.mkdir()
    sf.write(out / "a.wav", np.zeros(100, dtype=np.float32), 24000)
    np.save(out / "a.codes.npy", np.zeros((1, 16), dtype=np.int64))
    mine = {name: (out / name).read_bytes() for name in ("a.wav", "a.codes.npy")}
    files = lambda: sorted(p.name for p in out.iterdir())  # noqa: E731
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "3", "-q"]
    assert runner.invoke(app, args + ["--format", "flac"]).exit_code == 0
    assert files() == ["a.codes.npy", "a.flac", "a.wav", "b.flac", "results.jsonl"]
    assert {name: (out / name).read_bytes() for name in mine} == mine
    _fail_prepare_of(monkeypatch, "b")
    assert runner.invoke(app, args + ["--format", "ogg"]).exit_code == 1  # b fails: its flac stays
    monkeypatch.undo()
    assert "b.flac" in files()
    assert runner.invoke(app, args + ["--format", "ogg", "--retry-failed"]).exit_code == 0
    assert files() == ["a.codes.npy", "a.ogg", "a.wav", "b.ogg", "results.jsonl"]  # a's records named no codes
    assert {name: (out / name).read_bytes() for name in mine} == mine


def test_codes_of_your_own_stay_when_an_item_recorded_without_codes_runs_again(ckpt_dir, tmp_path):
    """Item a is written without --save-codes (its record names no codes); a.codes.npy put in OUT afterwards is
    the user's, not an earlier version's: a --force run without --save-codes keeps it. A record written before
    omnitts recorded `codes` (no such key) may have had codes: those go, as they did."""
    rows = [{"id": "a", "text": "Hi.", "speaker": "ryan"}]
    manifest, out = _manifest(tmp_path / "m.jsonl", rows), tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "3", "-q"]
    assert runner.invoke(app, args).exit_code == 0
    assert _records(out)[-1]["codes"] is None
    np.save(out / "a.codes.npy", np.arange(32, dtype=np.int64).reshape(2, 16))
    mine = (out / "a.codes.npy").read_bytes()
    assert runner.invoke(app, args + ["--force"]).exit_code == 0
    assert (out / "a.codes.npy").read_bytes() == mine
    assert runner.invoke(app, args + ["--force", "--save-codes"]).exit_code == 0
    assert _records(out)[-1]["codes"] == "a.codes.npy" and (out / "a.codes.npy").read_bytes() != mine
    assert runner.invoke(app, args + ["--force"]).exit_code == 0  # the codes omnitts wrote go with their version
    assert not (out / "a.codes.npy").exists()
    old = {k: v for k, v in _records(out)[-1].items() if k != "codes"}  # as an earlier omnitts wrote it
    with open(out / "results.jsonl", "a", encoding="utf-8") as log:
        log.write(json.dumps(old) + "\n")
    (out / "a.codes.npy").write_bytes(mine)
    assert runner.invoke(app, args + ["--force"]).exit_code == 0
    assert not (out / "a.codes.npy").exists()


def test_save_codes_runs_again_an_item_whose_record_names_no_codes_even_with_a_codes_file_there(ckpt_dir, tmp_path):
    """a.codes.npy beside an item recorded without codes is not its codes (a user's file, or one an earlier version
    left): --save-codes took it for them and skipped the item. It runs again and writes its own."""
    manifest, out = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}]), tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "3", "-q"]
    assert runner.invoke(app, args).exit_code == 0
    np.save(out / "a.codes.npy", np.zeros((7, 16), dtype=np.int64))
    ran = runner.invoke(app, args + ["--save-codes"])
    assert ran.exit_code == 0, ran.output
    assert len(_records(out)) == 2 and _records(out)[-1]["codes"] == "a.codes.npy"
    assert np.load(out / "a.codes.npy").shape == (3, 16)
    assert runner.invoke(app, args + ["--save-codes"]).exit_code == 0 and len(_records(out)) == 2  # now done


def test_read_results_of_a_missing_directory_is_an_error_and_of_an_empty_one_nothing(tmp_path):
    import omnitts

    assert omnitts.read_results(tmp_path) == {}  # nothing recorded yet
    with pytest.raises(FileNotFoundError, match="no such output directory"):
        omnitts.read_results(tmp_path / "ot")  # a mistyped path is not an empty run
    (tmp_path / "results.jsonl").write_text("")  # the log given for its folder: it was "no such output directory"
    with pytest.raises(FileNotFoundError, match=rf"^{tmp_path}/results.jsonl: a file, not an output directory; give "
                                                rf"the directory it is in \('{tmp_path}'\)$"):
        omnitts.read_results(tmp_path / "results.jsonl")


def test_the_last_record_wins_in_ledger_and_export(tmp_path):
    """Written by hand: an ok line followed by an error line for the same id means failed (and the
    reverse means done), whatever came before; a torn line is skipped."""
    from omnitts.batch.export import export_dataset
    from omnitts.batch.ledger import Ledger, read_results
    from omnitts.batch.manifest import iter_manifest
    from omnitts.batch.ledger import record

    out = tmp_path / "out"
    out.mkdir()
    for name in ("x", "y"):
        sf.write(out / f"{name}.wav", np.zeros(1920, dtype=np.float32), 24000)
    ok = lambda name, seed: record(name, "ok", path=f"{name}.wav", seconds=0.08, samples=1920, frames=1,  # noqa: E731
                                   seed=seed)
    lines = [ok("x", 1), record("x", "error", error="later failure"), record("y", "error", error="first"),
             ok("y", 2), ok("y", 3)]
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"id": "z", "sta',
                                       encoding="utf-8")
    ledger = Ledger(out)
    assert not ledger.is_done("x", out) and ledger.failed == {"x": "later failure"}
    assert ledger.is_done("y", out) and ledger.done["y"].seed == 3
    assert {k: r["status"] for k, r in read_results(out).items()} == {"x": "error", "y": "ok"}
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": k, "text": "Hi."} for k in ("x", "y", "z")])
    assert export_dataset(out, iter_manifest(manifest), tmp_path / "ds") == 1
    import datasets

    (row,) = datasets.load_from_disk(str(tmp_path / "ds"))
    assert row["id"] == "y" and row["seed"] == 3


def _cut(path, size):
    path.write_bytes(path.read_bytes()[:size])


@pytest.mark.parametrize("fmt", ["wav", "flac", "ogg"])
def test_audio_problem_sees_a_file_cut_short_from_its_header(tmp_path, fmt):
    from omnitts.batch.ledger import Done, audio_problem
    from omnitts.io.audio import FORMATS

    samples = (0.1 * np.random.RandomState(0).randn(38400)).astype(np.float32)
    path = tmp_path / f"b.{fmt}"
    sf.write(path, samples, 24000, format=fmt.upper(), subtype=FORMATS[fmt])
    full = path.read_bytes()
    record = Done(path.name, 1.6, 20, 0, 38400)
    assert audio_problem(path, record) is None
    assert audio_problem(path, record._replace(samples=None)) is None  # older records: from the seconds
    assert audio_problem(path, record._replace(samples=38399)) == f"b.{fmt}: 38400 samples, the record says 38399"
    assert "the record says 1.7 s" in audio_problem(path, record._replace(samples=None, seconds=1.7))
    for size in (1000, len(full) // 2, len(full) - 10):
        path.write_bytes(full)
        _cut(path, size)
        assert audio_problem(path, record) is not None, size
    path.unlink()
    assert audio_problem(path, record) == f"b.{fmt}: missing"
    sf.write(path, np.zeros(0, dtype=np.float32), 24000, format=fmt.upper(), subtype=FORMATS[fmt])
    assert audio_problem(path, record._replace(samples=0)) is None  # no audio (an empty flac/ogg cannot be opened)


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_a_truncated_output_is_redone(ckpt_dir, tmp_path, fmt):
    """A file cut short still opens (a wav header-only check passes it; a flac header still says the
    whole length): resume compares it with its record and runs the item again."""
    rows = [{"id": k, "text": f"Line {k}.", "speaker": "ryan"} for k in ("a", "b")]
    manifest = _manifest(tmp_path / "m.jsonl", rows)
    out = tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "20",
            "--greedy", "--format", fmt, "-q"]
    assert runner.invoke(app, args).exit_code == 0
    target = out / f"b.{fmt}"
    assert _records(out)[1]["samples"] == 20 * 1920
    _cut(target, 1000)
    sf.info(target)  # still opens
    assert runner.invoke(app, args).exit_code == 0
    assert [r["id"] for r in _records(out)] == ["a", "b", "b"]
    assert sf.info(target).frames == 20 * 1920
    assert runner.invoke(app, args).exit_code == 0 and len(_records(out)) == 3  # intact now: skipped


def test_a_lines_max_seconds_beats_the_run_wide_max_frames(ckpt_dir, tts_factory, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "own", "text": "A line with its own time limit.", "speaker": "ryan", "max_seconds": 0.4},
        {"id": "flag", "text": "A line without one.", "speaker": "ryan"},
    ])
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                 "--greedy", "--max-frames", "3", "-q"])
    assert result.exit_code == 0, result.output
    assert {r["id"]: r["frames"] for r in _records(out)} == {"own": 5, "flag": 3}
    # The Python API follows the same rule.
    tts = tts_factory("custom_voice")
    items = [{"id": "own", "text": "Own limit.", "speaker": "ryan", "max_seconds": 0.4},
             Request("Request limit.", speaker="ryan", id="req", max_seconds=0.56),
             {"id": "flag", "text": "No limit.", "speaker": "ryan"}]
    frames = {a.id: a.frames for a in tts.stream(items, greedy=True, max_frames=3)}
    assert frames == {"own": 5, "req": 7, "flag": 3}


def test_stop_finishes_running_items_and_drops_the_rest(tts_factory):
    tts = tts_factory("custom_voice")
    params = tts.default_params(greedy=True, max_frames=4)
    jobs = [Job(Request(f"Item {i}.", speaker="ryan", id=str(i)), params) for i in range(12)]
    outcomes = []
    pipeline = Pipeline(tts, lookahead=4, stop=lambda: len(outcomes) > 0)
    for outcome in pipeline.run(jobs):
        outcomes.append(outcome)
    finished = [o.job.request.id for o in outcomes]
    # Items already admitted when the stop came finish; nothing queued behind them starts.
    assert 1 <= len(finished) <= tts.max_batch and len(finished) < 12
    assert all(o.result.frames == 4 for o in outcomes)


def test_pipeline_reads_jobs_lazily_and_grows_the_engine(tts_factory):
    tts = tts_factory("custom_voice", max_batch=2)
    pulled = []

    def jobs():
        for i in range(10):
            pulled.append(i)
            frames = 3 if i < 8 else 90  # the last ones need a bigger engine
            yield Job(Request(f"Item {i}.", speaker="ryan", id=str(i)),
                      tts.default_params(greedy=True, max_frames=frames))

    pipeline = Pipeline(tts, lookahead=3)
    stream = pipeline.run(jobs())
    first = next(stream)
    # Prepared but unfinished requests stay within the running batch + lookahead (+1 being pulled).
    assert len(pulled) <= 2 + 3 + 1
    rest = list(stream)
    assert sorted(int(o.job.request.id) for o in [first] + rest) == list(range(10))
    assert pipeline.engines_built >= 2
    alone = tts.synthesize("Item 9.", speaker="ryan", greedy=True, max_frames=90)
    (nine,) = [o for o in rest if o.job.request.id == "9"]
    assert np.array_equal(nine.result.codes, alone.codes)


def test_interrupted_rerun_reports_how_to_resume(ckpt_dir, tmp_path, monkeypatch):
    """A Ctrl-C that escapes (the second press) leaves a clean directory and says how to resume."""
    import omnitts.batch.outdir

    rows = [{"id": f"u{i}", "text": f"Line {i}.", "speaker": "ryan"} for i in range(4)]
    manifest = _manifest(tmp_path / "m.jsonl", rows)
    out = tmp_path / "out"
    real_save = omnitts.batch.outdir.Batch.save
    calls = {"n": 0}

    def save_then_interrupt(self, outcome):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real_save(self, outcome)

    monkeypatch.setattr(omnitts.batch.outdir.Batch, "save", save_then_interrupt)
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "3",
            "--max-batch", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 130 and "run the same command again to resume" in result.output
    assert [r["id"] for r in _records(out)] == ["u0"]
    monkeypatch.setattr(omnitts.batch.outdir.Batch, "save", real_save)
    assert runner.invoke(app, args + ["-q"]).exit_code == 0
    assert sorted(r["id"] for r in _records(out)) == ["u0", "u1", "u2", "u3"]
    assert all(sf.info(out / f"u{i}.wav").frames == 3 * 1920 for i in range(4))


def _greedy_jobs(tts, texts, frames, **fields):
    params = tts.default_params(greedy=True, max_frames=frames)
    return [Job(Request(text, id=str(i), **fields), params) for i, text in enumerate(texts)]


def test_streamed_decode_matches_the_whole_utterance_decode(tts_factory, ref_wav):
    """Audio decoded in chunks while generating (batched across requests) == decode at the end."""
    cases = [("custom_voice", dict(speaker="ryan")),
             ("base", dict(ref_audio=ref_wav, ref_text="Reference words."))]  # ICL: reference frames cut
    for kind, fields in cases:
        tts = tts_factory(kind)
        texts = ["A first line.", "Second, a little longer line.", "Third."]
        frames = 70  # crosses several 25-frame decode chunks
        streamed = {o.job.request.id: o.result for o in Pipeline(tts).run(_greedy_jobs(tts, texts, frames, **fields))}
        whole = {o.job.request.id: o.result
                 for o in Pipeline(tts, stream_decode=False).run(_greedy_jobs(tts, texts, frames, **fields))}
        for i, text in enumerate(texts):
            reference = tts.run_reference(Request(text, **fields), tts.default_params(greedy=True, max_frames=frames))
            a, b = streamed[str(i)], whole[str(i)]
            assert np.array_equal(a.codes, reference.codes) and np.array_equal(b.codes, reference.codes)
            assert np.array_equal(b.samples, reference.samples)  # the whole decode is the reference's
            assert a.samples.shape == reference.samples.shape
            assert np.abs(a.samples - reference.samples).max() < 1e-5, (kind, i)


def test_scheduler_admits_in_order_then_longest_budget_first():
    from types import SimpleNamespace

    import torch

    from omnitts.engine.scheduler import Scheduler, Sequence
    from omnitts.params import SamplingParams

    def seq(i, frames):
        return Sequence(i, SimpleNamespace(embeds=torch.zeros(10, 1)), SamplingParams(max_frames=frames))

    budgets = [5, 30, 12, 30, 7, 40]
    arrival, longest = Scheduler(2), Scheduler(2)
    longest.longest_first = True
    for sched in (arrival, longest):
        for i, frames in enumerate(budgets):
            sched.add(seq(i, frames))
    order = {}
    for name, sched in (("arrival", arrival), ("longest", longest)):
        ids = []
        while sched.waiting:
            ids += [s.id for s in sched.admit()]
            for s in list(sched.running):
                sched.release(s)
        order[name] = ids
    assert order["arrival"] == [0, 1, 2, 3, 4, 5]
    assert order["longest"] == [5, 1, 3, 2, 4, 0]  # equal budgets (1 and 3) keep their arrival order
    # The prefill token cap still applies: 10 positions each, at most 15 -> one at a time.
    capped = Scheduler(4)
    capped.longest_first = True
    for i, frames in enumerate(budgets):
        capped.add(seq(i, frames))
    assert [s.id for s in capped.admit(max_tokens=15)] == [5]


def test_pipeline_starts_the_last_jobs_longest_first(tts_factory, monkeypatch):
    """Jobs start in order while more keep coming; the last ones (here: all of them, fewer than the
    lookahead) start longest budget first, so the batch stays full to the end."""
    from omnitts.engine.scheduler import Scheduler

    tts = tts_factory("custom_voice", max_batch=2)
    admitted = []
    real_admit = Scheduler.admit

    def record(self, *args):
        new = real_admit(self, *args)
        admitted.extend(seq.params.max_frames for seq in new)
        return new

    monkeypatch.setattr(Scheduler, "admit", record)
    budgets = [3, 9, 2, 8, 4]
    jobs = [Job(Request(f"Item {i}.", speaker="ryan", id=str(i)), tts.default_params(greedy=True, max_frames=f))
            for i, f in enumerate(budgets)]
    outcomes = list(Pipeline(tts, lookahead=8).run(jobs))
    assert admitted == sorted(budgets, reverse=True)
    assert sorted(o.result.frames for o in outcomes) == sorted(budgets)
    # While jobs still arrive they start in order: with a lookahead of 2, the 2 waits behind the 3 and
    # 9 and starts before the 8 (longest first throughout would start the 8 first).
    admitted.clear()
    list(Pipeline(tts, lookahead=2).run(jobs))
    assert admitted == budgets


def test_long_text_runs_as_parallel_pieces_joined_with_crossfades(tts_factory, monkeypatch):
    from omnitts.engine.join import crossfade_samples
    from omnitts.engine.scheduler import Scheduler
    from omnitts.text.split import split_text

    tts = tts_factory("custom_voice")
    text = ("The first sentence is here. A second one follows it. Then there is a third. "
            "And a fourth closes the paragraph.")
    pieces = split_text(text, max_chars=40)
    assert len(pieces) >= 3
    admitted = []
    real_admit = Scheduler.admit

    def record(self, *args):
        new = real_admit(self, *args)
        if new:
            admitted.append([seq.tag[1] for seq in new])
        return new

    monkeypatch.setattr(Scheduler, "admit", record)
    # Sampled: each piece has its own derived seed. The budget is the item's: the pieces share it.
    params = tts.default_params(max_frames=12 * len(pieces), seed=11)
    split = lambda t, language: split_text(t, max_chars=40, language=language)  # noqa: E731
    (outcome,) = Pipeline(tts, split=split).run([Job(Request(text, speaker="ryan", id="long"), params)])
    assert outcome.pieces == len(pieces)
    assert outcome.seed == 11 and outcome.seeds == [derive_seed(11, "piece", i) for i in range(len(pieces))]
    assert sorted(admitted[0]) == list(range(len(pieces)))  # all pieces admitted together: one batch
    fade = crossfade_samples(tts.sample_rate)
    shares = share_frames(12 * len(pieces), [tts.prepare(Request(p, speaker="ryan")).text_tokens for p in pieces])
    alone = [tts.synthesize(piece, speaker="ryan", max_frames=share, seed=derive_seed(11, "piece", i))
             for i, (piece, share) in enumerate(zip(pieces, shares))]
    assert outcome.result.frames == sum(a.frames for a in alone) == 12 * len(pieces)
    assert np.array_equal(outcome.result.codes, np.concatenate([a.codes for a in alone]))
    assert len(outcome.result.samples) == sum(len(a.samples) for a in alone) - (len(pieces) - 1) * fade
    # Outside the crossfades the joined audio is the pieces' own audio (up to the float rounding of
    # a batched codec call, see codec_stream.py).
    first = alone[0].samples
    assert np.abs(outcome.result.samples[: len(first) - fade] - first[:-fade]).max() < 1e-5


def test_synth_records_pieces_and_can_turn_splitting_off(ckpt_dir, tmp_path):
    text = "One sentence here. Another sentence there. A third one to finish."
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "long", "text": text, "speaker": "ryan"}])
    for chars, pieces in (("30", 3), ("0", 1)):
        out = tmp_path / f"out{chars}"
        result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                     "--greedy", "--max-frames", "5", "--split-chars", chars, "-q"])
        assert result.exit_code == 0, result.output
        (rec,) = _records(out)
        assert rec["pieces"] == pieces and rec["frames"] == 5  # the item's budget, shared by its pieces


@contextmanager
def _small_kv_cache(tts):
    """A K/V cache budget of a few hundred positions of the tiny talker meanwhile."""
    budget = tts.kv_budget_bytes
    tts.kv_budget_bytes = 200_000
    try:
        yield
    finally:
        tts.kv_budget_bytes = budget


def test_an_item_too_big_for_the_cache_fails_alone(tts_factory):
    tts = tts_factory("custom_voice", max_batch=2)
    with _small_kv_cache(tts):
        jobs = [Job(Request("Short.", speaker="ryan", id="small"), tts.default_params(greedy=True, max_frames=4)),
                Job(Request("Huge.", speaker="ryan", id="huge"), tts.default_params(greedy=True, max_frames=5000))]
        outcomes = {o.job.request.id: o for o in Pipeline(tts).run(jobs)}
    assert outcomes["small"].ok and outcomes["small"].result.frames == 4
    assert not outcomes["huge"].ok and "max_frames" in outcomes["huge"].error


def test_generate_prepared_equals_generate(tts_factory):
    tts = tts_factory("custom_voice")
    request, params = Request("Prepared ahead.", speaker="ryan", id="p"), tts.default_params(True, max_frames=5)
    (prepared,) = tts.generate_prepared([(request, tts.prepare(request), params)])
    (direct,) = tts.generate([(request, params)])
    assert prepared.frames == 5 and np.array_equal(prepared.codes, direct.codes)
    assert np.array_equal(prepared.samples, direct.samples)


def test_generate_and_generate_prepared_raise_a_failed_items_error(tts_factory):
    """An item that fails (here: too long for the K/V cache) raises its error from either; generate_prepared
    yielded None for it."""
    tts = tts_factory("custom_voice")
    request = Request("Huge.", speaker="ryan", id="huge")
    params = tts.default_params(greedy=True, max_frames=5000)
    with _small_kv_cache(tts):
        with pytest.raises(OmniTTSError, match=r"^jobs\[0\] \(id 'huge'\): .*max_frames"):
            list(tts.generate([(request, params)]))
        with pytest.raises(OmniTTSError, match="max_frames"):
            list(tts.generate_prepared([(request, tts.prepare(request), params)]))


def test_generate_names_the_job_that_fails_as_stream_names_its_item(tts_factory):
    """`generate` raised a failed job's error alone ("speaker: 'zz' is not known ..."), where `stream` says
    `requests[1] (id 'b'): ...`: the job is named by its index, and by its id where the request has one."""
    tts = tts_factory("custom_voice")
    params = tts.default_params(greedy=True, max_frames=2)
    for request, where in ((Request("Hi.", speaker="zz"), "jobs[1]"), (Request("Hi.", speaker="zz", id="b"),
                                                                        "jobs[1] (id 'b')")):
        with pytest.raises(RequestError, match=rf"^{re.escape(where)}: speaker: 'zz' is not known to this checkpoint"):
            list(tts.generate([(Request("Hi.", speaker="ryan"), params), (request, params)]))


def test_a_rebuilt_engine_replaces_the_old_one_in_memory(tts_factory, monkeypatch):
    """When a larger job needs a new engine, the old one (its K/V cache and graph pools, up to the cache
    budget on a GPU) is gone before the new one allocates: both alive at once is an out-of-memory there."""
    import gc
    import weakref

    import omnitts.engine.pipeline as pipeline_module

    tts = tts_factory("custom_voice", max_batch=2)
    built, alive_at_build = [], []
    real_engine = pipeline_module.Engine

    def engine(*args, **kwargs):
        gc.collect()
        alive_at_build.append(sum(ref() is not None for ref in built))
        new = real_engine(*args, **kwargs)
        built.append(weakref.ref(new))
        return new

    monkeypatch.setattr(pipeline_module, "Engine", engine)

    def jobs():
        for i, frames in enumerate([3, 3, 3, 90, 90]):  # the 90-frame items need a bigger engine
            yield Job(Request(f"Item {i}.", speaker="ryan", id=str(i)), tts.default_params(greedy=True, max_frames=frames))

    outcomes = list(Pipeline(tts, lookahead=2).run(jobs()))
    assert len(outcomes) == 5 and len(built) >= 2
    assert alive_at_build == [0] * len(built), alive_at_build


def test_items_are_saved_on_a_thread_of_their_own_while_frames_go_on(ckpt_dir, tmp_path, monkeypatch):
    """A finished item's file work (close, fsync, rename, result line) runs on the saver thread, in the order
    items finish, and the engine keeps stepping meanwhile: a commit that waits for the next engine step
    would never see one if saving blocked the loop. Every record still has its file.

    The loop's next step after a hand-over waits until the saver has begun that commit, so the saver is
    never left behind the loop's last frame by a slow thread switch (a loaded CI machine)."""
    import threading
    import time

    from omnitts.batch import run
    from omnitts.engine.engine import Engine
    from omnitts.io import audio

    steps, seen, closing = [], [], threading.Event()
    handed, begun = [], []
    step, commit, close, submit = Engine.step, audio.AudioSink.commit, run._Saver.close, run._Saver.submit

    def counted_step(self, *args, **kwargs):
        deadline = time.monotonic() + 30
        while len(begun) < len(handed) and time.monotonic() < deadline:
            time.sleep(0.005)
        steps.append(None)
        return step(self, *args, **kwargs)

    def counted_submit(self, outcome):
        handed.append(None)
        return submit(self, outcome)

    def waiting_commit(sink):
        start, deadline = len(steps), time.monotonic() + 30
        begun.append(None)
        while len(steps) == start and not closing.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)
        seen.append((sink.path.stem, threading.current_thread().name, len(steps) > start))
        return commit(sink)

    def noted_close(self):
        closing.set()  # the loop has ended: no more steps will come
        return close(self)

    monkeypatch.setattr(Engine, "step", counted_step)
    monkeypatch.setattr(audio.AudioSink, "commit", waiting_commit)
    monkeypatch.setattr(run._Saver, "close", noted_close)
    monkeypatch.setattr(run._Saver, "submit", counted_submit)
    rows = [{"id": f"i{n}", "text": "Saved apart.", "speaker": "ryan", "max_seconds": n * 0.08} for n in (2, 4, 6, 8)]
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(_manifest(tmp_path / "m.jsonl", rows)), "-m",
                                 str(ckpt_dir("custom_voice")), "-o", str(out), "--max-batch", "4", "-q"])
    assert result.exit_code == 0, result.output
    assert [name for _, name, _ in seen] == ["omnitts-saver"] * 4
    assert [item for item, _, _ in seen] == ["i2", "i4", "i6", "i8"]  # the order items finished
    assert all(stepped for _, _, stepped in seen[:3])  # frames went on while the first three were saved
    records = _records(out)
    assert [r["id"] for r in records] == ["i2", "i4", "i6", "i8"]
    assert all((out / r["path"]).exists() for r in records)


def test_a_pipeline_that_cannot_be_built_leaves_no_saver_thread_behind(ckpt_dir, tmp_path, monkeypatch):
    """The saver thread is not a daemon (queued items are saved before the interpreter exits), so one left
    waiting would keep the process alive: a failure before the loop starts must not leave one."""
    import threading

    from omnitts.engine import pipeline

    def broken(self, *args, **kwargs):
        raise RuntimeError("no pipeline here")

    monkeypatch.setattr(pipeline.Pipeline, "__init__", broken)
    rows = [{"id": "a", "text": "Never run.", "speaker": "ryan"}]
    result = runner.invoke(app, ["synth", str(_manifest(tmp_path / "m.jsonl", rows)), "-m",
                                 str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "out"), "--max-frames", "3", "-q"])
    assert result.exit_code != 0
    assert not [t for t in threading.enumerate() if t.name == "omnitts-saver"]


def test_a_record_whose_error_names_a_file_that_is_not_utf8_is_written_and_read_back(tmp_path):
    """A file name of bytes that are not UTF-8 reaches Python as lone surrogates; an error message that
    names one is logged with the JSON escape, not lost to an encoding error (which would end the run)."""
    from omnitts.batch.ledger import Ledger, read_results
    from omnitts.batch.ledger import record

    message = "cannot read audio: /refs/caf\udce9.wav"
    Ledger(tmp_path).write(record("x", "error", error=message))
    assert b"caf\\udce9.wav" in (tmp_path / "results.jsonl").read_bytes()
    assert read_results(tmp_path)["x"]["error"] == message and Ledger(tmp_path).failed == {"x": message}


def test_a_good_record_without_its_file_or_length_is_passed_over_as_a_torn_line(tmp_path):
    """results.jsonl edited by hand (or by another tool): an "ok" line that does not name a plain file in
    the directory and its length is no record: its item runs again, not a KeyError; nothing outside the
    directory is ever named by the log."""
    from omnitts.batch.ledger import Ledger, read_results
    from omnitts.batch.ledger import record

    good = record("x", "ok", path="x.wav", seconds=0.08, samples=1920, frames=1, seed=1)
    lines = [{"id": "a", "status": "ok"}, {**good, "id": "b", "path": "../../etc/passwd"},
             {**good, "id": "c", "path": ".hidden.wav"}, {**good, "id": "d", "seconds": "long"},
             {**good, "id": "e", "frames": None}, {**good, "id": "f", "samples": 1.5}, good,
             {"id": "g", "status": "error"}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    sf.write(tmp_path / "x.wav", np.zeros(1920, dtype=np.float32), 24000)
    ledger = Ledger(tmp_path)
    assert set(ledger.done) == {"x"} and ledger.is_done("x", tmp_path) and set(ledger.failed) == {"g"}
    assert set(read_results(tmp_path)) == {"x", "g"}


@pytest.mark.parametrize("greedy", [False, True])
def test_an_items_sampling_parameters_built_once_per_set_of_overrides_equal_those_built_for_it_alone(tmp_path, greedy):
    """Batch.job keeps the parameters of each set of per-line overrides built (`_unseeded`): every item's, seed and
    value types included, equal what SamplingParams.from_generation_config makes for it alone (as it did per item)."""
    from types import SimpleNamespace

    from omnitts.batch.manifest import Item
    from omnitts.batch.outdir import Batch
    from omnitts.batch.settings import Settings
    from omnitts.params import SamplingParams

    config = SimpleNamespace(generation={"temperature": 0.8, "top_k": 30, "max_new_tokens": 500})
    settings = Settings(greedy=greedy, max_frames=60, seed=5)
    items = [Item(1, Request("Hi.", id="a"), None), Item(2, Request("Hi.", id="b"), 9),
             Item(3, Request("Hi.", id="c", max_seconds=2.0), 9, sampling={"temperature": 1}),
             Item(4, Request("Hi.", id="d"), None, sampling={"temperature": 1.0}),
             Item(5, Request("Hi.", id="e"), 9, sampling={"temperature": 1, "top_k": 0}),
             Item(6, Request("Hi.", id="f"), None, sampling={"temperature": 1})]
    with Batch(tmp_path / "out", settings, config, "ck") as batch:
        for item in items * 2:
            want = SamplingParams.from_generation_config(
                config.generation, max_frames=None if item.request.max_seconds is not None else 60,
                seed=item.seed if item.seed is not None else 5, **item.sampling)
            want = want.greedy() if greedy else want
            got = batch.job(item).params
            assert got == want and type(got.temperature) is type(want.temperature), (item.request.id, got, want)


def test_a_records_file_name_is_told_from_a_path_as_pathlib_tells_it():
    from pathlib import Path

    from omnitts.batch.ledger import _plain_name

    for path in ("a.wav", "", ".", "..", ".a.wav", "a/b.wav", "/a.wav", "a.wav/", "./a.wav", "a//", "a\\b.wav",
                 "a b.wav", "\u00e9.flac", "a\x00.wav", "C:a.wav"):
        assert _plain_name(path) == (Path(path).name == path), path
