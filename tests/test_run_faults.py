"""A fault while one item is generated, decoded or named fails the item at fault, never the run; a broken
device ends the run without blaming any item.

Faults are injected where they would arise: `Engine.step` (a NaN/inf guard, an index error from one
request's codes), the codec (`CodecStreams._run`, the batched decode call; `decode_codes` without
streaming), the device (`Backend.broken`, what a sticky CUDA error makes of every later call) and the
filesystem (a file name it refuses). The items not at fault must finish with the audio a clean run gives
them; the failed ones are recorded with a one-line error and redone by `--retry-failed`.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from omnitts.batch.ledger import read_results
from omnitts.cli import app
from omnitts.device.base import Backend
from omnitts.engine import engine as engine_module
from omnitts.engine import faults as faults_module
from omnitts.engine import pipeline as pipeline_module
from omnitts.engine.pipeline import Job, Pipeline
from omnitts.errors import DeviceFailed, OmniTTSError
from omnitts.models.codec_streams import CodecStreams
from omnitts.request import Request

TEXTS = {"a": "First line here.", "b": "The second one breaks.", "c": "Third, and fine.", "d": "Fourth line.",
         "e": "Fifth and last."}


def _jobs(tts, frames: int):
    return [Job(Request(text, speaker="ryan", id=name), tts.default_params(greedy=True, max_frames=frames))
            for name, text in TEXTS.items()]


def _run(pipeline, jobs) -> dict:
    outcomes = {}
    for outcome in pipeline.run(jobs):
        assert outcome.job.request.id not in outcomes, "an item came out twice"
        outcomes[outcome.job.request.id] = outcome
    assert outcomes.keys() == TEXTS.keys()
    return outcomes


def _same_audio(got, clean):
    """The same codes, and the same audio up to rounding: a codec call that raised is retried row by row,
    and a row decoded alone rounds a little differently from one in a batch (codec_stream.py)."""
    assert got.ok, got.error
    np.testing.assert_array_equal(got.result.codes, clean.result.codes)
    np.testing.assert_allclose(got.result.samples, clean.result.samples, rtol=0, atol=1e-5)


def _item_of(seq) -> str:
    return seq.tag[0].job.request.id


def _step_fails_while(target: str, monkeypatch, after_frames: int = 2, times: int | None = None):
    """Engine.step raises once a request of item `target` has run `after_frames` frames (the first `times`
    times only, if given: a fault that passes)."""
    step = engine_module.Engine.step
    raised = []

    def faulty(self):
        if (times is None or len(raised) < times) and any(
                _item_of(seq) == target and seq.launched >= after_frames for seq in self.scheduler.running):
            raised.append(sorted({_item_of(seq) for seq in self.scheduler.running}))
            raise FloatingPointError("non-finite logits\nin row 1")
        return step(self)

    monkeypatch.setattr(engine_module.Engine, "step", faulty)
    return raised


@pytest.mark.parametrize("batch", [2, 4])
def test_a_fault_in_an_engine_step_fails_only_the_item_at_fault(tts_factory, monkeypatch, batch):
    """The failed step held b and others (which row raised cannot be told): each of them is tried again
    from its start, one at a time beside the other items; b fails on its own trial, the rest finish with
    the audio of a clean run."""
    tts = tts_factory("custom_voice", max_batch=batch)
    clean = _run(Pipeline(tts), _jobs(tts, 6))
    raised = _step_fails_while("b", monkeypatch)
    pipeline = Pipeline(tts)
    outcomes = _run(pipeline, _jobs(tts, 6))
    error = "FloatingPointError while generating: non-finite logits in row 1"
    assert {k: o.error for k, o in outcomes.items() if not o.ok} == {"b": error}
    assert isinstance(outcomes["b"].exception, FloatingPointError)
    for name in "acde":
        _same_audio(outcomes[name], clean[name])
    assert len(raised) == 2 and len(raised[0]) == batch and "b" in raised[1]  # its batch, then its trial
    assert pipeline.engines_built == 3  # an engine that raised is not used again
    assert not pipeline.audio.decoding and not pipeline.audio.codec.streams  # every codec stream freed
    assert not pipeline.faults.suspects and pipeline.faults.failed_in_a_row == 0


def test_a_fault_that_passes_fails_no_item(tts_factory, monkeypatch):
    """A step that raised once (the item is not at fault after all): every item it held runs again and
    finishes as in a clean run, however far its audio had streamed."""
    tts = tts_factory("custom_voice", max_batch=4, codec_chunk_frames=4)
    clean = _run(Pipeline(tts), _jobs(tts, 20))
    raised = _step_fails_while("b", monkeypatch, after_frames=10, times=1)
    outcomes = _run(Pipeline(tts), _jobs(tts, 20))
    assert raised == [["a", "b", "c", "d"]]
    for name in TEXTS:
        _same_audio(outcomes[name], clean[name])


def test_two_items_at_fault_in_one_step_each_fail_on_their_own_trial(tts_factory, monkeypatch):
    tts = tts_factory("custom_voice", max_batch=2)
    step = engine_module.Engine.step

    def faulty(self):
        if any(_item_of(seq) in "bc" and seq.launched >= 2 for seq in self.scheduler.running):
            raise FloatingPointError("non-finite logits")
        return step(self)

    monkeypatch.setattr(engine_module.Engine, "step", faulty)
    outcomes = _run(Pipeline(tts), _jobs(tts, 6))
    assert sorted(k for k, o in outcomes.items() if not o.ok) == ["b", "c"]
    assert all(o.attempts == 1 for o in outcomes.values())


def test_an_item_fails_once_it_shared_max_involved_failures(tts_factory, monkeypatch):
    """The bound on trials: with MAX_INVOLVED at 1, every item of a failed step fails at once (no trial)."""
    tts = tts_factory("custom_voice", max_batch=2)
    monkeypatch.setattr(faults_module, "MAX_INVOLVED", 1)
    raised = _step_fails_while("b", monkeypatch)
    outcomes = _run(Pipeline(tts), _jobs(tts, 6))
    assert sorted(k for k, o in outcomes.items() if not o.ok) == ["a", "b"] and len(raised) == 1


def _broken_after_first_fault(monkeypatch, reason="AcceleratorError: CUDA error: an illegal memory access was "
                                                  "encountered"):
    """The device answers `broken()` with `reason` from the first fault on (a sticky error)."""
    monkeypatch.setattr(Backend, "broken", lambda self: reason)


def test_a_broken_device_ends_the_run_without_blaming_an_item(tts_factory, monkeypatch, tmp_path):
    from omnitts.io.audio import AudioSink

    tts = tts_factory("custom_voice", max_batch=2)
    _step_fails_while("b", monkeypatch)
    _broken_after_first_fault(monkeypatch)
    sinks = []

    def sink(job):
        sinks.append(AudioSink(tmp_path / f"{job.request.id}.wav", tts.sample_rate))
        return sinks[-1]

    pipeline, seen = Pipeline(tts, sink=sink), []
    with pytest.raises(DeviceFailed) as failed:
        seen.extend(pipeline.run(_jobs(tts, 6)))  # what came out before the raise stays in `seen`
    assert str(failed.value) == ("the cpu device stopped working (FloatingPointError: non-finite logits in row 1; "
                                 "then a test computation raised AcceleratorError: CUDA error: an illegal memory "
                                 "access was encountered)")
    assert seen == []  # a and b are not recorded failed: a re-run on a working device does them
    assert list(tmp_path.iterdir()) == []  # every item's partial audio deleted


def test_engines_failing_in_a_row_mean_a_broken_device(tts_factory, monkeypatch):
    """A device whose check passes but on which every engine fails at once: after DEVICE_FAILURES engines
    in a row with no good step, the run ends; the items are not blamed one by one."""
    tts = tts_factory("custom_voice", max_batch=2)
    raised = []

    def always(self):
        raised.append(1)
        raise RuntimeError("NPU function error: aclnnMatmul, error code is 507015")

    monkeypatch.setattr(engine_module.Engine, "step", always)
    seen = []
    with pytest.raises(DeviceFailed, match=r"^3 engines in a row failed on the cpu device with no good step between "
                                           r"them \(last: RuntimeError: NPU function error: aclnnMatmul, error code "
                                           r"is 507015\); it is taken for broken$"):
        seen.extend(Pipeline(tts).run(_jobs(tts, 6)))
    assert seen == [] and len(raised) == faults_module.DEVICE_FAILURES


def test_a_broken_device_while_decoding_ends_the_run(tts_factory, monkeypatch):
    tts = tts_factory("custom_voice", max_batch=4, codec_chunk_frames=4)
    pipeline = Pipeline(tts)
    _codec_fails_for("b", pipeline, monkeypatch)
    _broken_after_first_fault(monkeypatch, "RuntimeError: CUDA error: unspecified launch failure")
    with pytest.raises(DeviceFailed, match="unspecified launch failure"):
        list(pipeline.run(_jobs(tts, 20)))


def test_a_fault_in_an_engine_step_fails_only_its_items_pieces_once(tts_factory, monkeypatch):
    """A split item fails once (one outcome), however many of its pieces ran or waited."""
    tts = tts_factory("custom_voice", max_batch=1)
    _step_fails_while("b", monkeypatch)
    split = (lambda text, language: text.split(" ") if text == TEXTS["b"] else [text])
    outcomes = _run(Pipeline(tts, split=split), _jobs(tts, 12))
    assert [k for k, o in outcomes.items() if not o.ok] == ["b"] and outcomes["b"].pieces == 4
    monkeypatch.undo()
    clean = _run(Pipeline(tts, split=split), _jobs(tts, 12))
    for name in "acde":
        _same_audio(outcomes[name], clean[name])


def _codec_fails_for(target: str, pipeline, monkeypatch):
    """The batched codec call raises whenever it holds a row of item `target`'s stream."""
    run = CodecStreams._run

    def faulty(self, jobs):
        owners = {state.sid: _item_of(seq) for seq, state in pipeline.audio.decoding.items()}
        if any(owners.get(sid) == target for sid, *_ in jobs):
            raise IndexError("index 2048 is out of bounds for dimension 0 with size 2048")
        return run(self, jobs)

    monkeypatch.setattr(CodecStreams, "_run", faulty)


@pytest.mark.parametrize("frames", [4, 20], ids=["at-the-end", "while-streaming"])
def test_a_fault_decoding_one_item_fails_that_item_only(tts_factory, monkeypatch, frames):
    """4 frames: all audio is decoded when the stream closes; 20 frames at 4-frame chunks: in batched pumps
    while generation goes on (the call holding b's row is retried row by row)."""
    tts = tts_factory("custom_voice", max_batch=4, codec_chunk_frames=4)
    clean = _run(Pipeline(tts), _jobs(tts, frames))
    pipeline = Pipeline(tts)
    _codec_fails_for("b", pipeline, monkeypatch)
    outcomes = _run(pipeline, _jobs(tts, frames))
    assert [k for k, o in outcomes.items() if not o.ok] == ["b"]
    assert outcomes["b"].error == ("IndexError while decoding: index 2048 is out of bounds for dimension 0 with "
                                   "size 2048")
    for name in "acde":
        _same_audio(outcomes[name], clean[name])
    assert not pipeline.audio.decoding and not pipeline.audio.codec.streams and not pipeline.audio.codec.broken


NOT_NUMBERS = ("FloatingPointError while decoding: the codec gave samples that are not numbers (NaN or infinity): a "
               "damaged checkpoint, or a --codec-dtype too narrow for it (float32 is the default)")


class _NaNCopy:
    """A codec call's host copy whose samples are all NaN (a codec that overflowed)."""

    def __init__(self, copy):
        self.copy = copy

    def result(self):
        return np.full_like(self.copy.result(), np.nan)


@pytest.mark.parametrize("frames", [4, 20], ids=["at-the-end", "while-streaming"])
def test_samples_that_are_not_numbers_fail_their_item_only(tts_factory, monkeypatch, frames):
    """soundfile would write NaN as full scale: a file of noise that no error names. Streamed or not, the item
    whose codec output is NaN fails, saying so, and the others are as in a clean run."""
    from omnitts.engine import reference

    tts = tts_factory("custom_voice", max_batch=4, codec_chunk_frames=4)
    clean = _run(Pipeline(tts), _jobs(tts, frames))
    pipeline = Pipeline(tts)
    run = CodecStreams._run

    def overflowing(self, jobs):
        out = run(self, jobs)
        owners = {state.sid: _item_of(seq) for seq, state in pipeline.audio.decoding.items()}
        for sid in out:
            if owners.get(sid) == "b":
                out[sid] = [(_NaNCopy(copy), row, lo, hi) for copy, row, lo, hi in out[sid]]
        return out

    monkeypatch.setattr(CodecStreams, "_run", overflowing)
    outcomes = _run(pipeline, _jobs(tts, frames))
    assert [k for k, o in outcomes.items() if not o.ok] == ["b"] and outcomes["b"].error == NOT_NUMBERS
    for name in "acde":
        _same_audio(outcomes[name], clean[name])
    decode = reference.decode_codes
    monkeypatch.setattr(reference, "decode_codes", lambda *args: np.full_like(decode(*args), np.inf))
    outcomes = _run(Pipeline(tts, stream_decode=False), _jobs(tts, frames))
    assert {o.error for o in outcomes.values()} == {NOT_NUMBERS}


def test_a_fault_decoding_a_whole_utterance_fails_that_item_only(tts_factory, monkeypatch):
    from omnitts.engine import reference

    tts = tts_factory("custom_voice", max_batch=4)
    clean = _run(Pipeline(tts, stream_decode=False), _jobs(tts, 4))
    decode = reference.decode_codes
    calls = []

    def faulty(ckpt, codes, ref_codes=None):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("codec blew up")
        return decode(ckpt, codes, ref_codes)

    monkeypatch.setattr(reference, "decode_codes", faulty)
    outcomes = _run(Pipeline(tts, stream_decode=False), _jobs(tts, 4))
    failed = [k for k, o in outcomes.items() if not o.ok]
    assert len(failed) == 1 and outcomes[failed[0]].error == "RuntimeError while decoding: codec blew up"
    for name in set(TEXTS) - set(failed):
        _same_audio(outcomes[name], clean[name])


# ---------------------------------------------------------------- through the command line

runner = CliRunner()


def _manifest(tmp_path, ids=TEXTS):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"id": k, "text": TEXTS.get(k, "Some words."), "speaker": "ryan"}) + "\n"
                            for k in ids))
    return path


def _synth(ckpt_dir, manifest, out, *extra):
    return runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                               "--greedy", "--max-frames", "4", "-q", *extra])


def test_an_item_failed_while_generating_is_recorded_and_redone_by_retry_failed(ckpt_dir, tmp_path, monkeypatch):
    manifest, out = _manifest(tmp_path), tmp_path / "out"
    clean = _synth(ckpt_dir, manifest, tmp_path / "clean", "--max-batch", "1")
    assert clean.exit_code == 0, clean.output
    _step_fails_while("b", monkeypatch)
    result = _synth(ckpt_dir, manifest, out, "--max-batch", "1")
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    records = read_results(out)
    assert {k: r["status"] for k, r in records.items()} == {"a": "ok", "b": "error", "c": "ok", "d": "ok", "e": "ok"}
    assert records["b"]["error"] == "FloatingPointError while generating: non-finite logits in row 1"
    assert "error: b: FloatingPointError while generating: non-finite logits in row 1" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["a.wav", "c.wav", "d.wav", "e.wav", "results.jsonl"]
    for name in "acde":
        assert (out / f"{name}.wav").read_bytes() == (tmp_path / "clean" / f"{name}.wav").read_bytes()
    monkeypatch.undo()  # the fault is gone
    again = _synth(ckpt_dir, manifest, out, "--max-batch", "1")
    assert again.exit_code == 1 and "1 item failed in an earlier run" in again.output
    retried = _synth(ckpt_dir, manifest, out, "--max-batch", "1", "--retry-failed")
    assert retried.exit_code == 0, retried.output
    assert read_results(out)["b"]["status"] == "ok"
    assert (out / "b.wav").read_bytes() == (tmp_path / "clean" / "b.wav").read_bytes()


def test_an_item_at_fault_in_a_shared_step_fails_alone_and_the_others_keep_their_clean_audio(ckpt_dir, tmp_path,
                                                                                            monkeypatch):
    """--max-batch 2: a ran beside b when the step raised; a is tried again from its start (its partial
    audio file deleted, a new one written) and has the codes of a clean run, and its audio up to the
    rounding of a codec call with other rows (as every item beside others in another run)."""
    import soundfile as sf

    manifest, out = _manifest(tmp_path), tmp_path / "out"
    flags = ("--max-batch", "2", "--max-frames", "80", "--save-codes", "--format", "flac")
    clean = _synth(ckpt_dir, manifest, tmp_path / "clean", *flags)
    assert clean.exit_code == 0, clean.output
    raised = _step_fails_while("b", monkeypatch, after_frames=70)  # a's first audio is in its file by then
    result = _synth(ckpt_dir, manifest, out, *flags)
    assert result.exit_code == 1, result.output
    assert raised[0] == ["a", "b"]
    records = read_results(out)
    assert {k: r["status"] for k, r in records.items()} == {"a": "ok", "b": "error", "c": "ok", "d": "ok", "e": "ok"}
    assert sorted(p.name for p in out.iterdir()) == [f"{k}.{x}" for k in "acde" for x in ("codes.npy", "flac")] + [
        "results.jsonl"]
    for name in "acde":
        np.testing.assert_array_equal(np.load(out / f"{name}.codes.npy"),
                                      np.load(tmp_path / "clean" / f"{name}.codes.npy"))
        got, want = sf.read(out / f"{name}.flac")[0], sf.read(tmp_path / "clean" / f"{name}.flac")[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=2 / 32768)  # flac: 16-bit, one step of rounding


def test_a_broken_device_stops_the_run_with_one_line_and_resume_finishes(ckpt_dir, tmp_path, monkeypatch):
    manifest, out = _manifest(tmp_path), tmp_path / "out"
    clean = _synth(ckpt_dir, manifest, tmp_path / "clean", "--max-batch", "1")
    assert clean.exit_code == 0, clean.output
    _step_fails_while("c", monkeypatch)
    _broken_after_first_fault(monkeypatch, "RuntimeError: CUDA error: an illegal memory access was encountered")
    result = _synth(ckpt_dir, manifest, out, "--max-batch", "1")
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.output.strip().splitlines()[-1] == (
        "error: the cpu device stopped working (FloatingPointError: non-finite logits in row 1; then a test "
        "computation raised RuntimeError: CUDA error: an illegal memory access was encountered): 2 items done "
        f"({out}/results.jsonl), the items it was running not recorded; run the same command again to resume once "
        "the device works")
    assert list(read_results(out)) == ["a", "b"]  # c is not recorded failed: the device was at fault
    # Nothing half-written; c's claim stays, saying it was running: the next run counts a death for it.
    assert sorted(p.name for p in out.iterdir()) == [".c.omnitts-claim", "a.wav", "b.wav", "results.jsonl"]
    assert json.loads((out / ".c.omnitts-claim").read_text())["running"] is True
    monkeypatch.undo()
    again = _synth(ckpt_dir, manifest, out, "--max-batch", "1")
    assert again.exit_code == 0, again.output
    assert {k: r["status"] for k, r in read_results(out).items()} == dict.fromkeys(TEXTS, "ok")
    assert sorted(p.name for p in out.iterdir()) == [f"{k}.wav" for k in TEXTS] + ["results.jsonl"]
    for name in TEXTS:
        assert (out / f"{name}.wav").read_bytes() == (tmp_path / "clean" / f"{name}.wav").read_bytes()


def test_an_id_too_long_for_the_filesystem_fails_that_item_only(ckpt_dir, tmp_path, monkeypatch):
    """Ids up to 200 characters are valid, but a filesystem may hold shorter names (eCryptfs: 143 bytes)."""
    from omnitts.io import atomic

    long_id = "x" * 150
    manifest, out = _manifest(tmp_path, ["a", long_id, "c"]), tmp_path / "out"
    temp_name = atomic.temp_name
    probe = Path(temp_name(tmp_path / "a.wav"))
    assert len(probe.name) - len("a.wav") == atomic.TEMP_EXTRA  # what the error message says
    probe.unlink()

    def short_names(path):
        if len(Path(path).name) + atomic.TEMP_EXTRA > 143:
            raise OSError(errno.ENAMETOOLONG, "File name too long", str(path))
        return temp_name(path)

    monkeypatch.setattr(atomic, "temp_name", short_names)
    result = _synth(ckpt_dir, manifest, out, "--save-codes")
    assert result.exit_code == 1, result.output
    records = read_results(out)
    assert records["a"]["status"] == records["c"]["status"] == "ok"
    assert records[long_id]["error"] == (
        f"id: the file name '{long_id}.wav' (154 bytes, and omnitts writes it under a temporary name "
        f"{atomic.TEMP_EXTRA} bytes longer) is too long for the filesystem of {out} (File name too long); use a shorter id")
    assert sorted(p.name for p in out.iterdir()) == ["a.codes.npy", "a.wav", "c.codes.npy", "c.wav", "results.jsonl"]
    monkeypatch.undo()
    assert _synth(ckpt_dir, manifest, out, "--save-codes", "--retry-failed").exit_code == 0
    assert read_results(out)[long_id]["status"] == "ok"


# ---------------------------------------------------------------- write errors other than a full disk

def _failing_at_third(monkeypatch, out, kind: str, code: int):
    """Make the third item's write fail with `code`: at its rename (`commit`), while it streams (`write`,
    libsndfile's own "System error."), or while its record is appended (`record`). Returns the failing path."""
    import soundfile as sf

    from omnitts.batch import ledger
    from omnitts.io import audio

    calls = []
    if kind == "record":
        write_all = ledger._write_all

        def record(fd, data):
            calls.append(data)
            if len(calls) == 3:
                write_all(fd, data[:10])  # a torn line, cut back by the ledger
                raise OSError(code, __import__("os").strerror(code), str(out / "results.jsonl"))
            write_all(fd, data)

        monkeypatch.setattr(ledger, "_write_all", record)
        return out / "results.jsonl"
    name = "commit" if kind == "commit" else "write"
    real = getattr(audio.AudioSink, name)

    def failing(sink, *args):
        if sink.path.name not in calls:
            calls.append(sink.path.name)
        if calls.index(sink.path.name) == 2:
            if kind == "commit":
                raise OSError(code, __import__("os").strerror(code), sink.tmp)
            real(sink, *args)
            with audio.os_errors(sink.path):  # what libsndfile raises, with the C errno cffi kept
                sf._ffi.errno = code
                raise sf.LibsndfileError(audio.SF_ERR_SYSTEM)
        return real(sink, *args)

    monkeypatch.setattr(audio.AudioSink, name, failing)
    return out / "c.wav"


def test_an_out_turned_read_only_mid_run_is_one_line_though_its_claims_cannot_be_deleted(ckpt_dir, tmp_path,
                                                                                        monkeypatch):
    """OUT turned read-only (or immutable, chattr +i) after two records: the next claim cannot be made, and
    the claims held ahead cannot be deleted as the run leaves; still one line and exit 1 (it was that line,
    then a traceback from Batch.close), and the same command resumes once OUT is writable."""
    from omnitts.batch import claims, ledger

    manifest, out = _manifest(tmp_path), tmp_path / "out"
    write, unlink, open_locked = ledger.Ledger.write, Path.unlink, claims.open_locked
    frozen = []

    def record(self, rec):
        write(self, rec)
        if len(read_results(out)) == 2:
            frozen.append(True)

    def refused(path):
        if frozen and Path(path).name.endswith(claims.CLAIM):  # (the sinks' temporaries: test_a_write_error_...)
            raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(ledger.Ledger, "write", record)
    monkeypatch.setattr(claims, "open_locked", lambda path, create: refused(path) or open_locked(path, create))
    monkeypatch.setattr(Path, "unlink", lambda path, missing_ok=False: refused(path) or unlink(path, missing_ok))
    result = _synth(ckpt_dir, manifest, out, "--max-batch", "1")
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot write {out}/.") and last.endswith(
        ".omnitts-claim: Read-only file system (EROFS): 2 items done "
        f"({out}/results.jsonl); fix that and run the same command again to resume"), result.output
    monkeypatch.undo()
    assert _synth(ckpt_dir, manifest, out, "--max-batch", "1").exit_code == 0
    assert sorted(read_results(out)) == sorted(TEXTS) and not list(out.glob(".*"))


def test_a_write_error_on_a_damaged_file_does_not_count_it_as_done(ckpt_dir, tmp_path, monkeypatch):
    """A damaged file being redone is not "done" in the write error's count, though its old record says ok."""
    manifest, out = _manifest(tmp_path, ["a", "b", "c"]), tmp_path / "out"
    assert _synth(ckpt_dir, manifest, out).exit_code == 0
    (out / "b.wav").unlink()  # its file gone, and nothing can be written in its place:
    rename = os.replace

    def failing(source, target):
        if Path(target).name == "b.wav":
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(target))
        rename(source, target)

    monkeypatch.setattr(os, "replace", failing)
    result = _synth(ckpt_dir, manifest, out)
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"error: cannot write {out / 'b.wav'}: {os.strerror(errno.EIO)} (EIO): 2 items done ({out}/results.jsonl); "
        "fix that and run the same command again to resume")


def test_an_export_with_no_item_done_says_nothing_was_exported(ckpt_dir, tmp_path, monkeypatch):
    from omnitts.api import TTS

    def failing(self, request):
        raise RuntimeError("no luck")

    monkeypatch.setattr(TTS, "prepare", failing)
    out, target = tmp_path / "out", tmp_path / "export"
    result = _synth(ckpt_dir, _manifest(tmp_path, ["a"]), out, "--export-dataset", str(target))
    assert result.exit_code == 1, result.output
    assert (f"--export-dataset {target}: nothing exported, no item of the manifest has audio in {out}"
            in " ".join(result.output.split())), result.output
    assert not target.exists()


def test_ctrl_c_before_anything_is_recorded_says_so(ckpt_dir, tmp_path, monkeypatch):
    import omnitts.api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(omnitts.api, "load", interrupted)
    result = _synth(ckpt_dir, _manifest(tmp_path), tmp_path / "out")
    assert result.exit_code == 130, result.output
    assert result.output.strip() == "interrupted before any item was recorded; run the same command again to start"


@pytest.mark.parametrize("kind, code, text", [("commit", errno.EACCES, "Permission denied (EACCES)"),
                                              ("write", errno.EIO, "Input/output error (EIO)"),
                                              ("record", errno.EROFS, "Read-only file system (EROFS)")])
def test_a_write_error_stops_the_run_with_one_line_and_resume_finishes(ckpt_dir, tmp_path, monkeypatch, kind, code,
                                                                       text):
    manifest, out = _manifest(tmp_path), tmp_path / "out"
    path = _failing_at_third(monkeypatch, out, kind, code)
    result = _synth(ckpt_dir, manifest, out, "--max-batch", "1")
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.output.strip().splitlines()[-1] == (
        f"error: cannot write {path}: {text}: 2 items done ({out}/results.jsonl); fix that and run the same "
        "command again to resume")
    records = read_results(out)
    assert list(records) == ["a", "b"] and all(r["status"] == "ok" for r in records.values())
    assert sorted(p.name for p in out.iterdir()) == ["a.wav", "b.wav", "results.jsonl"]  # nothing half-written
    assert (out / "results.jsonl").read_bytes().endswith(b"\n")
    monkeypatch.undo()
    assert _synth(ckpt_dir, manifest, out, "--max-batch", "1").exit_code == 0
    assert sorted(read_results(out)) == sorted(TEXTS) and not list(out.glob(".*"))


def test_a_name_refused_at_the_rename_fails_that_item_only(ckpt_dir, tmp_path, monkeypatch):
    """The check before an item runs can miss (a name limit that differs inside one directory tree); the
    rename that then fails with ENAMETOOLONG is that item's failure too."""
    from omnitts.io import audio

    manifest, out = _manifest(tmp_path, ["a", "b", "c"]), tmp_path / "out"
    commit = audio.AudioSink.commit

    def refuse_b(sink):
        if sink.path.stem == "b":
            raise OSError(errno.ENAMETOOLONG, "File name too long", str(sink.path))
        return commit(sink)

    monkeypatch.setattr(audio.AudioSink, "commit", refuse_b)
    result = _synth(ckpt_dir, manifest, out)
    assert result.exit_code == 1, result.output
    records = read_results(out)
    assert records["a"]["status"] == records["c"]["status"] == "ok"
    assert records["b"]["error"].startswith("id: the file name 'b.wav' (5 bytes, ")
    assert sorted(p.name for p in out.iterdir()) == ["a.wav", "c.wav", "results.jsonl"]


# ---------------------------------------------------------------- --export-dataset

def _export_fails(monkeypatch, code=errno.ENOSPC):
    """save_to_disk writes part of the dataset, then the disk is full."""
    import datasets

    save = datasets.Dataset.save_to_disk

    def half(self, path, **kwargs):
        save(self, path, **kwargs)
        (Path(path) / "dataset_info.json").unlink()
        raise OSError(code, __import__("os").strerror(code), str(Path(path) / "data-00000-of-00001.arrow"))

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", half)


def test_a_full_disk_during_the_export_leaves_no_export_and_the_items_stay_done(ckpt_dir, tmp_path, monkeypatch):
    import datasets

    manifest, out, target = _manifest(tmp_path, ["a", "b"]), tmp_path / "out", tmp_path / "ds"
    _export_fails(monkeypatch)
    result = _synth(ckpt_dir, manifest, out, "--export-dataset", str(target))
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"error: --export-dataset {target}: no space left on device; nothing was exported, the 2 items done in {out} "
        "stay done: fix that and run the same command again to export")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl", "out"]  # no target, no temporary sibling
    log = (out / "results.jsonl").read_bytes()
    assert sorted(read_results(out)) == ["a", "b"]
    monkeypatch.undo()
    again = _synth(ckpt_dir, manifest, out, "--export-dataset", str(target))
    assert again.exit_code == 0, again.output
    assert (out / "results.jsonl").read_bytes() == log  # nothing synthesized again
    assert datasets.load_from_disk(str(target))["id"] == ["a", "b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "m.jsonl", "out"]


def test_an_export_deletes_what_a_killed_export_left_but_not_a_running_ones(ckpt_dir, tmp_path):
    """A SIGKILL during the export left its temporary sibling (rows.arrow: a copy of the audio) for good; the
    next export deletes it, and leaves alone the sibling of an export still running (its lock held)."""
    import fcntl
    import os

    from omnitts.batch.export import WORK_LOCK

    out, target = tmp_path / "out", tmp_path / "ds"
    killed, running = tmp_path / ".ds.omnitts-k1ll3d00.tmp", tmp_path / ".ds.omnitts-runn1ng0.tmp"
    for work in (killed, running):
        work.mkdir()
        (work / WORK_LOCK).touch()
        (work / "rows.arrow").write_bytes(b"\0" * 1000)
    held = os.open(running / WORK_LOCK, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert _synth(ckpt_dir, _manifest(tmp_path, ["a"]), out, "--export-dataset", str(target)).exit_code == 0
    finally:
        os.close(held)
    assert sorted(p.name for p in tmp_path.iterdir()) == [running.name, "ds", "m.jsonl", "out"]


def test_an_export_onto_a_saved_dataset_that_is_no_export_is_refused(ckpt_dir, tmp_path, monkeypatch):
    """Any saved dataset was taken for an earlier export and replaced: a user's corpus given as --export-dataset
    by mistake was deleted. Only a dataset with an export's columns is replaced; another is refused before the
    model loads, and kept."""
    import datasets

    import omnitts.api

    corpus = tmp_path / "corpus"
    datasets.Dataset.from_dict({"path": ["x.wav"], "transcript": ["Mine."]}).save_to_disk(str(corpus))
    before = {p.name: p.read_bytes() for p in corpus.iterdir()}
    with monkeypatch.context() as patch:
        patch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
        refused = _synth(ckpt_dir, _manifest(tmp_path, ["a"]), tmp_path / "out", "--export-dataset", str(corpus))
    assert refused.exit_code == 2 and refused.output.strip() == (
        f"error: --export-dataset {corpus}: is a saved dataset that is not an omnitts export (its columns: path, "
        "transcript); an export replaces its target, so choose an empty or new folder"), refused.output
    assert {p.name: p.read_bytes() for p in corpus.iterdir()} == before
    target = tmp_path / "ds"  # an earlier export is replaced, as before
    for ids in (["a"], ["a", "b"]):
        result = _synth(ckpt_dir, _manifest(tmp_path, ids), tmp_path / "out", "--export-dataset", str(target))
        assert result.exit_code == 0, result.output
        assert datasets.load_from_disk(str(target))["id"] == ids


def test_a_failed_export_keeps_the_previous_one_and_a_folder_of_other_files_is_refused(ckpt_dir, tmp_path,
                                                                                      monkeypatch):
    import datasets

    import omnitts.api

    out, target = tmp_path / "out", tmp_path / "ds"
    assert _synth(ckpt_dir, _manifest(tmp_path, ["a"]), out, "--export-dataset", str(target)).exit_code == 0
    _export_fails(monkeypatch, errno.EIO)
    result = _synth(ckpt_dir, _manifest(tmp_path, ["a", "b"]), out, "--export-dataset", str(target))
    assert result.exit_code == 1 and "Input/output error (EIO); nothing was exported" in result.output, result.output
    assert datasets.load_from_disk(str(target))["id"] == ["a"]  # the previous export, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "m.jsonl", "out"]
    monkeypatch.undo()
    assert _synth(ckpt_dir, _manifest(tmp_path, ["a", "b"]), out, "--export-dataset", str(target)).exit_code == 0
    assert datasets.load_from_disk(str(target))["id"] == ["a", "b"]  # replaced
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"not yours to delete")
    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    refused = _synth(ckpt_dir, _manifest(tmp_path, ["c"]), out, "--export-dataset", str(other))
    assert refused.exit_code == 2 and refused.output.strip() == (
        f"error: --export-dataset {other}: is a folder that holds something else than a saved dataset; an export "
        "replaces its target, so choose an empty or new folder")
    assert (other / "cat.jpg").read_bytes() == b"not yours to delete"
    for folder in (tmp_path / "new-out", tmp_path):  # --out itself (not made yet), or a folder holding it
        refused = _synth(ckpt_dir, _manifest(tmp_path, ["c"]), tmp_path / "new-out", "--export-dataset", str(folder))
        assert refused.exit_code == 2 and refused.output.strip() == (
            f"error: --export-dataset {folder}: is the output directory or holds it; an export replaces its target, "
            "so choose a folder outside --out")
    assert not (tmp_path / "new-out").exists()
    long = tmp_path / ("d" * 300)  # a name too long: pathlib raised its OSError, a traceback
    refused = _synth(ckpt_dir, _manifest(tmp_path, ["c"]), tmp_path / "new-out", "--export-dataset", str(long))
    assert refused.exit_code == 2 and refused.output.strip() == f"error: --export-dataset {long}: File name too long"
    inside = tmp_path / "new-out" / "ds"  # a folder inside OUT: OUT is for the items' files alone
    refused = _synth(ckpt_dir, _manifest(tmp_path, ["c"]), tmp_path / "new-out", "--export-dataset", str(inside))
    assert refused.exit_code == 2 and refused.output.strip() == (
        f"error: --export-dataset {inside}: is inside the output directory {tmp_path / 'new-out'}; choose a folder "
        "outside --out")
    assert not (tmp_path / "new-out").exists()


def test_an_export_target_that_cannot_be_made_is_refused_before_the_model_loads(ckpt_dir, tmp_path, monkeypatch):
    """--export-dataset under a file, or on a read-only filesystem, was found once every item was synthesized:
    'cannot write notes.txt: File exists (EEXIST); nothing was exported'. Refused first, as --out is."""
    import omnitts.api
    from omnitts.batch import folder

    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    (tmp_path / "notes.txt").write_text("a file")
    target = tmp_path / "notes.txt" / "ds"
    refused = _synth(ckpt_dir, _manifest(tmp_path, ["a"]), tmp_path / "out", "--export-dataset", str(target))
    assert refused.exit_code == 2 and refused.output.strip() == (
        f"error: --export-dataset {target}: {tmp_path / 'notes.txt'} is a file, not a directory (choose a directory; "
        "omnitts creates it if missing)"), refused.output
    read_only = tmp_path / "mnt"
    read_only.mkdir()
    real = os.statvfs
    monkeypatch.setattr(folder.os, "statvfs", lambda p: type("V", (), {"f_flag": os.ST_RDONLY})()
                        if Path(p) == read_only else real(p))
    target = read_only / "ds"
    refused = _synth(ckpt_dir, _manifest(tmp_path, ["a"]), tmp_path / "out", "--export-dataset", str(target))
    assert refused.exit_code == 2 and refused.output.strip() == (
        f"error: --export-dataset {target}: {read_only} is on a read-only filesystem (choose a writable "
        "--export-dataset)"), refused.output
    assert not (tmp_path / "out").exists()


def test_an_export_onto_the_manifest_it_reads_is_refused_before_anything_runs(ckpt_dir, tmp_path, monkeypatch):
    """A saved dataset read as the manifest is a dataset an export may replace: `--export-dataset` naming it
    replaced the input with the export, its other columns lost. Refused, as is a folder holding the manifest."""
    import datasets

    import omnitts.api

    source = tmp_path / "data" / "lines"
    datasets.Dataset.from_dict({"id": ["a"], "text": ["Hi."], "speaker": ["ryan"], "note": ["keep"]}).save_to_disk(
        str(source))
    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    for target in (source, source.parent):
        refused = _synth(ckpt_dir, source, tmp_path / "out", "--export-dataset", str(target))
        assert refused.exit_code == 2 and refused.output.strip() == (
            f"error: --export-dataset {target}: is the manifest or holds it; an export replaces its target, so "
            "choose another folder"), refused.output
    assert datasets.load_from_disk(str(source))["note"] == ["keep"]
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the kernel build's note

def test_the_kernel_build_logs_instead_of_printing_and_the_cli_shows_it_unless_quiet(ckpt_dir, tmp_path, monkeypatch,
                                                                                  capfd, caplog):
    import logging
    import shutil

    import omnitts.api
    from omnitts.device import native

    if shutil.which("true") is None:
        pytest.skip("needs a `true` command")
    with monkeypatch.context() as patched, caplog.at_level(logging.INFO, logger="omnitts"):
        patched.setenv("CXX", "true")  # a "compiler" that succeeds at once and writes nothing
        patched.setattr(native.platform, "machine", lambda: "x86_64")
        # imported afresh, as by a process's first build: torch's CUDA builds print "No CUDA runtime is found"
        # on stderr as it imports on a machine without a GPU (CI's oldest stack), which the build keeps quiet
        patched.delitem(sys.modules, "torch.utils.cpp_extension", raising=False)
        native.build(tmp_path / "k" / "kernels.so")  # (only here: the runs below use the real kernels)
    assert [r.name for r in caplog.records] == ["omnitts.device.native"]
    assert caplog.records[0].getMessage().startswith("omnitts: compiling its CPU kernels for this machine")
    assert capfd.readouterr() == ("", "")  # the library itself prints nothing
    load = omnitts.api.load

    def building(*args, **kwargs):
        logging.getLogger("omnitts.device.native").info("omnitts: compiling its CPU kernels (test)")
        return load(*args, **kwargs)

    monkeypatch.setattr(omnitts.api, "load", building)
    manifest = _manifest(tmp_path, ["a"])
    shown = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o",
                                str(tmp_path / "o1"), "--max-frames", "2"])
    assert shown.exit_code == 0 and "omnitts: compiling its CPU kernels (test)\n" in shown.output, shown.output
    quiet = _synth(ckpt_dir, manifest, tmp_path / "o2")
    assert quiet.exit_code == 0 and "compiling" not in quiet.output


def test_the_device_check_passes_on_a_working_device_and_reports_a_sticky_error():
    from omnitts.device.fake import FakeGraphBackend

    backend = FakeGraphBackend()  # the CUDA and NPU backends' check, on the CPU
    assert backend.broken() is None and Backend().broken() is None

    def sticky():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
                           "asynchronously reported")

    backend.api.synchronize = sticky
    assert backend.broken() == ("RuntimeError: CUDA error: an illegal memory access was encountered CUDA kernel "
                                "errors might be asynchronously reported")


# -- memory ---------------------------------------------------------------------------------------
def test_out_of_memory_knows_each_devices_allocation_failure():
    from omnitts.device import out_of_memory

    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name (CUDA)
        pass

    assert out_of_memory(MemoryError()) and out_of_memory(OutOfMemoryError("CUDA out of memory. Tried to ..."))
    assert out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate "
                                      "memory: you tried to allocate 25600000000 bytes"))
    assert out_of_memory(RuntimeError("NPU out of memory. Tried to allocate 2.00 GiB"))
    assert not out_of_memory(RuntimeError("index 5 is out of bounds")) and not out_of_memory(ValueError("memory"))


def test_the_codec_states_size_is_known_before_it_is_allocated(tts_factory):
    from omnitts.models.codec_stream import StreamingCodec

    codec = StreamingCodec(tts_factory("custom_voice").ckpt.codec)
    for batch in (1, 3):
        assert codec.state_bytes(batch) == sum(t.numel() * t.element_size() for t in codec.new_state(batch).values())
    assert codec.state_bytes(3) == 3 * codec.state_bytes(1) > 0


def test_a_max_batch_too_large_for_memory_is_one_line_naming_it(ckpt_dir, tmp_path, tts_factory, monkeypatch):
    """The codec's state for max_batch streams is allocated when a run starts: more than half the free memory
    is refused with one line (a CPU would otherwise swap, or the out-of-memory killer end the process without
    a word); an engine that does not fit (a device's OutOfMemoryError) says the same. Nothing is recorded."""
    manifest, out = _manifest(tmp_path, ["a"]), tmp_path / "out"
    result = _synth(ckpt_dir, manifest, out, "--max-batch", str(10**9))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]  # rich 13 stops a quiet bar with "\n"
    assert len(lines) == 1 and lines[0].endswith(
        "free); lower --max-batch (max_batch in a recipe or in omnitts.load)"), result.output
    assert lines[0].startswith(f"error: max batch {10**9}: the codec's state for that many streams does not fit in "
                               "cpu memory ("), result.output
    assert not (out / "results.jsonl").exists() or not (out / "results.jsonl").read_text()
    tts = tts_factory("custom_voice")
    monkeypatch.setattr(Backend, "free_memory", lambda self: 1000)  # the library says it too
    with pytest.raises(OmniTTSError, match=r"^max batch 8: the codec's state for that many streams does not fit in "
                                           r"cpu memory \(0\.0 GB of state, 0\.1 MB a stream, against 0\.0 GB free\)"):
        tts.synthesize("Hello.", speaker="ryan", max_frames=2)
    monkeypatch.setattr(Backend, "free_memory", lambda self: None)

    def no_room(self, ckpt, config):
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(pipeline_module.Engine, "__init__", no_room)
    with pytest.raises(OmniTTSError, match=r"^max batch 8: an engine of \d+ rows x \d+ positions does not fit in cpu "
                                           r"memory \(CUDA out of memory\. Tried to allocate 20\.00 GiB\); lower "
                                           r"--max-batch \(max_batch in a recipe or in omnitts\.load\)$"):
        tts.synthesize("Hello.", speaker="ryan", max_frames=2)


def test_a_model_too_large_for_memory_is_one_line_naming_the_checkpoint(ckpt_dir, tmp_path, monkeypatch):
    """Weights that do not fit while loading (the CPU allocator's error, a GPU's OutOfMemoryError) are one
    error naming the checkpoint and what to do, not a traceback; another loading error is left as it is."""
    import omnitts
    from omnitts import api

    def no_room(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 7000000000 bytes. "
                           "Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(api, "load_checkpoint", no_room)
    model = ckpt_dir("custom_voice")
    result = _synth(ckpt_dir, _manifest(tmp_path, ["a"]), tmp_path / "out", "--dtype", "float32")
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == (
        f"error: {model}: the model does not fit in cpu memory while loading (DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 7000000000 bytes. Error code 12 (Cannot allocate memory)); choose a smaller "
        "--dtype (bfloat16), free memory or use a device with more"), result.output
    monkeypatch.setattr(api, "load_checkpoint", lambda *args, **kwargs: (_ for _ in ()).throw(MemoryError()))
    with pytest.raises(OmniTTSError, match=r"does not fit in cpu memory while loading \(MemoryError\); free memory"):
        omnitts.load(model, dtype="bfloat16")
    monkeypatch.setattr(api, "load_checkpoint", lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="^other$"):
        omnitts.load(model)


def test_an_accelerators_free_memory_bounds_the_codec_state_too(tts_factory, monkeypatch):
    """The accelerator backends' `free_memory` (mem_get_info plus the allocator's unused reserve), through the
    CPU fake's API; a device that cannot say is no check, never a failed run."""
    from omnitts.device.fake import FakeGraphBackend

    backend = FakeGraphBackend()
    assert backend.free_memory() > 0
    backend.api.mem_get_info = lambda: (1000, 10**9)
    backend.api.memory_reserved, backend.api.memory_allocated = (lambda: 3000), (lambda: 2500)
    assert backend.free_memory() == 1500
    monkeypatch.setattr(pipeline_module, "get_backend", lambda name, eager=False: backend)
    with pytest.raises(OmniTTSError, match=r"^max batch 8: the codec's state for that many streams does not fit"):
        tts_factory("custom_voice").synthesize("Hello.", speaker="ryan", max_frames=2)

    def unsupported():
        raise AttributeError("module 'torch.npu' has no attribute 'mem_get_info'")

    backend.api.mem_get_info = unsupported
    assert backend.free_memory() is None


def test_a_folder_where_an_items_file_goes_fails_that_item_alone(ckpt_dir, tmp_path):
    """A folder OUT/intro.wav stopped the whole run once intro was synthesized ("cannot write .../intro.wav: Is a
    directory (EISDIR): 0 items done", exit 1, the other items unrun); now intro fails before it runs, naming the
    folder, and the others are written. The folder is left as it was."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": name, "text": "Hello there.", "speaker": "ryan"}) + "\n"
                                for name in ("intro", "outro")))
    out = tmp_path / "out"
    (out / "intro.wav").mkdir(parents=True)
    (out / "intro.wav" / "keep.txt").write_text("mine")
    result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                      "--max-frames", "3", "-q"])
    assert result.exit_code == 1, result.output
    records = read_results(out)
    assert records["outro"]["status"] == "ok" and (out / "outro.wav").is_file()
    assert records["intro"]["error"] == (f"id: {out / 'intro.wav'} is a folder, where this item's file goes; move or "
                                         "rename that folder, or give the line another id")
    assert (out / "intro.wav" / "keep.txt").read_text() == "mine"
