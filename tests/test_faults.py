"""Faults outside omnitts' control end as one error line, never a traceback (README "Exit codes").

- a full disk (ENOSPC, simulated: no tiny filesystem can be mounted here) stops the run with one line,
  exit 1; the item being written leaves no temporary file and no record, and runs again on resume;
- an unusable --out is one `error:` line naming the path, exit 2, before the model loads;
- a bad line without a usable id is recorded under a placeholder (`line:N`) no real id can take.
SIGTERM is covered with the real signals in tests/test_signals.py.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from omnitts.batch.ledger import Ledger, read_results
from omnitts.batch.manifest import SAFE_ID, BadLine, iter_manifest, placeholder
from omnitts.cli import app
from omnitts.io import audio

runner = CliRunner()


def _manifest(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- placeholder ids

def test_a_placeholder_id_is_never_a_real_id():
    assert placeholder("line", 2) == "line:2" and placeholder("row", 7) == "row:7"
    assert not SAFE_ID.match(placeholder("line", 2)) and not SAFE_ID.match(placeholder("row", 0))


def test_a_bad_line_does_not_block_a_real_item_named_like_its_old_placeholder(ckpt_dir, tmp_path):
    """Bad line 2 has no id; the item "line-2" is real. Before, the bad line was recorded as "line-2": every
    run wrote an error record over the real item's and synthesized it again."""
    rows = [{"id": "a", "text": "First.", "speaker": "ryan"}, {"text": "No id here.", "speaker": "ryan"},
            {"id": "line-2", "text": "Named like a placeholder.", "speaker": "ryan"}]
    manifest = _manifest(tmp_path / "m.jsonl", rows)
    bad = [e for e in iter_manifest(manifest) if isinstance(e, BadLine)]
    assert [(b.line, b.id) for b in bad] == [(2, "line:2")]
    out = tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--greedy", "--max-frames",
            "2", "-q"]
    assert runner.invoke(app, args).exit_code == 1  # the bad line has no audio
    first = _records(out)
    assert runner.invoke(app, args).exit_code == 1
    assert _records(out) == first  # nothing recorded or synthesized again
    assert {k: r["status"] for k, r in read_results(out).items()} == {"a": "ok", "line:2": "error", "line-2": "ok"}


# ---------------------------------------------------------------- unusable --out

def _bad_out(ckpt_dir, tmp_path, out, monkeypatch, *extra):
    import omnitts.api

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded despite an unusable --out")

    monkeypatch.setattr(omnitts.api, "load", no_load)
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "-q",
                                 *extra])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --out {out}: "), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return lines[0]


@pytest.mark.parametrize("strict", [False, True], ids=["", "strict"])
def test_an_out_that_is_a_file_is_one_line_and_exit_2(ckpt_dir, tmp_path, monkeypatch, strict):
    (tmp_path / "file.txt").write_text("not a directory")
    line = _bad_out(ckpt_dir, tmp_path, tmp_path / "file.txt", monkeypatch, *(["--strict"] if strict else []))
    assert line.endswith("is a file, not a directory (choose a directory; omnitts creates it if missing)")
    line = _bad_out(ckpt_dir, tmp_path, tmp_path / "file.txt" / "out", monkeypatch)
    assert f"{tmp_path / 'file.txt'} is a file, not a directory" in line
    line = _bad_out(ckpt_dir, tmp_path, "/dev/null", monkeypatch)  # it read "is, not a directory"
    assert line == ("error: --out /dev/null: is a device, pipe or socket, not a directory (choose a directory; omnitts "
                    "creates it if missing)")
    assert (tmp_path / "file.txt").read_text() == "not a directory"


def test_an_out_on_a_read_only_filesystem_is_one_line_and_exit_2(ckpt_dir, tmp_path, monkeypatch):
    import os

    from omnitts.batch import folder

    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(folder.os, "statvfs", lambda path: ReadOnly())
    line = _bad_out(ckpt_dir, tmp_path, tmp_path / "new" / "out", monkeypatch)
    assert line.endswith(f"{tmp_path} is on a read-only filesystem (choose a writable --out)")
    assert not (tmp_path / "new").exists()  # nothing created


def test_an_out_where_no_directory_can_be_made_is_one_line_and_exit_2(ckpt_dir, tmp_path, monkeypatch):
    """/sys refuses new directories even to root (EPERM); where it is mounted read-only, or for another user,
    check_out says so instead. Either way: one line, exit 2."""
    _bad_out(ckpt_dir, tmp_path, "/sys/omnitts-test-out", monkeypatch)


def test_outs_own_result_log_as_the_manifest_is_refused_before_it_grows(ckpt_dir, tmp_path, monkeypatch):
    """Every line of a result log is a bad manifest line (unknown fields), and pass 1 records each bad line in the
    log it was reading: the file grew without end (88,000 lines in a minute) until the disk was full."""
    import omnitts.api

    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    out = tmp_path / "out"
    out.mkdir()
    log = out / "results.jsonl"
    log.write_text(json.dumps({"id": "a", "status": "error", "error": "earlier"}) + "\n")
    before = log.read_bytes()
    monkeypatch.chdir(tmp_path)
    for manifest, given in ((log, out), (Path("out/results.jsonl"), Path("out/./"))):
        result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(given),
                                     "-q"])
        assert result.exit_code == 2 and result.output.strip() == (
            f"error: --out {given}: {manifest} is its result log, which the run appends to, not a manifest; give the "
            "manifest its lines came from"), result.output
    assert log.read_bytes() == before


# ---------------------------------------------------------------- a full disk

ROWS = [{"id": f"u{i}", "text": f"Utterance number {i}.", "speaker": "ryan"} for i in range(6)]


def _full_disk_run(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", ROWS)
    out = tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--greedy", "--max-frames",
            "3", "--max-batch", "2", "-q"]
    return out, lambda: runner.invoke(app, args)


def _enospc(path="x"):
    return OSError(errno.ENOSPC, "No space left on device", str(path))


def _check_stopped(result, out):
    """One line, exit 1; only whole files with their records; no temporary file."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    records = _records(out)
    assert all(r["status"] == "ok" for r in records), records  # a full disk is no item's failure
    assert result.output.strip().splitlines()[-1] == (
        f"error: no space left on {out}: {len(records)} item{'' if len(records) == 1 else 's'} done "
        f"({out}/results.jsonl); free some space and run the same command again to resume")
    assert sorted(p.name for p in out.iterdir()) == sorted(["results.jsonl"] + [r["path"] for r in records])
    assert (out / "results.jsonl").read_bytes().endswith(b"\n")
    for r in records:
        assert sf.info(out / r["path"]).frames == 3 * 1920
    return records


def _check_resumed(result, out, before):
    assert result.exit_code == 0, result.output
    records = _records(out)
    assert records[:len(before)] == before  # nothing done is redone
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in ROWS)  # each id once
    assert all(r["status"] == "ok" for r in records) and not list(out.glob(".*.tmp"))


def test_a_full_disk_at_an_items_rename_stops_the_run_and_resume_finishes(ckpt_dir, tmp_path, monkeypatch):
    out, run = _full_disk_run(ckpt_dir, tmp_path)
    commit, calls = audio.AudioSink.commit, []

    def full_at_the_third(sink):
        calls.append(sink.path.name)
        if len(calls) == 3:  # the temporary file is written; putting it in place fails
            assert sink.tmp is not None and sf.info(sink.tmp).frames == 3 * 1920
            raise _enospc(sink.path)
        return commit(sink)

    monkeypatch.setattr(audio.AudioSink, "commit", full_at_the_third)
    records = _check_stopped(run(), out)
    assert len(records) == 2 and len(calls) == 3  # no item started after the failed one
    monkeypatch.setattr(audio.AudioSink, "commit", commit)  # space freed
    _check_resumed(run(), out, records)


def test_a_full_disk_while_an_item_streams_stops_the_run_and_resume_finishes(ckpt_dir, tmp_path, monkeypatch):
    out, run = _full_disk_run(ckpt_dir, tmp_path)
    write, sinks = audio.AudioSink.write, []

    def full_in_the_third(sink, samples):
        if sink not in sinks:
            sinks.append(sink)
        write(sink, samples)  # part of the audio reaches the temporary file, then the disk is full
        if len(sinks) == 3 and sink is sinks[2]:
            raise _enospc(sink.tmp)

    monkeypatch.setattr(audio.AudioSink, "write", full_in_the_third)
    records = _check_stopped(run(), out)
    assert len(sinks) == 3 and sinks[2].path.stem not in {r["id"] for r in records}
    monkeypatch.setattr(audio.AudioSink, "write", write)
    _check_resumed(run(), out, records)


def test_a_full_disk_while_appending_a_record_leaves_no_torn_line_and_no_unrecorded_file(ckpt_dir, tmp_path,
                                                                                        monkeypatch):
    """The audio is in place when its record cannot be written: it is removed again (it would hold space the
    resumed run needs, and no record vouches for it), and the item runs again on resume."""
    from omnitts.batch import ledger

    out, run = _full_disk_run(ckpt_dir, tmp_path)
    write_all, calls = ledger._write_all, []

    def half_then_full(fd, data):
        calls.append(data)
        if len(calls) == 3:
            write_all(fd, data[:len(data) // 2])  # a torn line on disk
            raise _enospc(out / "results.jsonl")
        write_all(fd, data)

    monkeypatch.setattr(ledger, "_write_all", half_then_full)
    records = _check_stopped(run(), out)
    lost = json.loads(calls[2])["id"]
    assert len(records) == 2 and lost not in {r["id"] for r in records}
    assert not (out / f"{lost}.wav").exists()
    assert Ledger(out).done.keys() == {r["id"] for r in records}
    monkeypatch.setattr(ledger, "_write_all", write_all)
    _check_resumed(run(), out, records)


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_libsndfile_on_a_full_device_raises_enospc():
    """libsndfile's own error for a full disk is "System error." with no cause; os_errors recovers it."""
    with (pytest.raises(OSError) as caught, audio.os_errors("/dev/full"),
          sf.SoundFile("/dev/full", "w", samplerate=24000, channels=1, format="WAV", subtype="PCM_16") as f):
        f.write(np.zeros(24000, dtype=np.float32))
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == "/dev/full"


def test_a_full_disk_while_claiming_an_item_leaves_no_claim_file(ckpt_dir, tmp_path, monkeypatch):
    """A claim file is created (an inode, no data) and then stamped: on a full disk the stamp fails. The
    empty claim was left in OUT after the run (seen on a 400 KB tmpfs) and its descriptor stayed open."""
    from omnitts.batch import claims

    out, run = _full_disk_run(ckpt_dir, tmp_path)
    stamp, stamped = claims._stamp, []

    def full_at_the_second_claim(fd, **fields):
        if "id" in fields and fields["id"] not in stamped:  # an item's first stamp: its claim
            stamped.append(fields["id"])
            if len(stamped) == 2:
                raise _enospc(out / f".{fields['id']}{claims.CLAIM}")
        stamp(fd, **fields)

    monkeypatch.setattr(claims, "_stamp", full_at_the_second_claim)
    result = run()
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1].startswith(
        f"error: no space left on {out}: 0 items done"), result.output
    assert not list(out.glob(f".*{claims.CLAIM}")) and not list(out.glob(".omnitts-writer-*"))
    monkeypatch.setattr(claims, "_stamp", stamp)
    _check_resumed(run(), out, [])


def test_a_full_disk_while_recording_a_bad_line_is_one_line_before_the_model_loads(ckpt_dir, tmp_path, monkeypatch):
    import omnitts.api
    from omnitts.batch import ledger

    def full(fd, data):
        raise _enospc(tmp_path / "out" / "results.jsonl")

    monkeypatch.setattr(ledger, "_write_all", full)
    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    manifest = _manifest(tmp_path / "m.jsonl", [ROWS[0], {"text": "No id.", "speaker": "ryan"}])
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "-q"])
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1].startswith(
        f"error: no space left on {out}: 0 items done"), result.output
    assert (out / "results.jsonl").read_bytes() == b""  # created empty; the failed line was cut back


def test_an_aborted_sink_leaves_no_file_even_when_closing_fails(tmp_path):
    sink = audio.AudioSink(tmp_path / "a.wav", 24000)
    sink.write(np.zeros(1920, dtype=np.float32))
    assert sink.tmp is not None and (tmp_path / sink.tmp).exists()
    real = sink._file

    class Failing:  # closing a file on a full disk can fail again
        closed = False

        def close(self):
            real.close()
            raise _enospc(sink.tmp)

    sink._file = Failing()
    sink.abort()  # raises nothing: it runs while the first error is on its way out
    assert list(tmp_path.iterdir()) == []
