"""One item's fault fails that item only: the rest of the run goes on (issue: no single line breaks a batch)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from omnitts.engine.pipeline import Job, Pipeline
from omnitts.errors import AudioError
from omnitts.io.audio import MAX_REFERENCE_SECONDS, load_reference
from omnitts.request import Request


def test_an_unexpected_exception_while_preparing_fails_only_that_item(tts_factory, monkeypatch):
    tts = tts_factory("custom_voice", max_batch=2)
    prepare = type(tts).prepare

    def flaky(self, request):
        if request.text == "Breaks.":
            raise IndexError("index 4096 is out of bounds for dimension 0 with size 2048")
        return prepare(self, request)

    monkeypatch.setattr(type(tts), "prepare", flaky)
    jobs = [Job(Request(text, speaker="ryan", id=name), tts.default_params(greedy=True, max_frames=3))
            for name, text in (("a", "First."), ("b", "Breaks."), ("c", "Third."))]
    outcomes = {o.job.request.id: o for o in Pipeline(tts).run(jobs)}
    assert outcomes["a"].ok and outcomes["c"].ok and outcomes["a"].result.frames == 3
    assert not outcomes["b"].ok
    error = "IndexError while preparing: index 4096 is out of bounds for dimension 0 with size 2048"
    assert outcomes["b"].error == error
    assert isinstance(outcomes["b"].exception, IndexError)


def _tone(path, seconds: float, rate: int = 16000):
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    sf.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate)
    return path


def test_a_long_reference_is_refused_for_icl_and_cut_for_the_speaker_embedding(tmp_path):
    """At most MAX_REFERENCE_SECONDS of a clip are read: in-context cloning refuses a longer clip (its
    transcript would not match what is used), the speaker embedding alone uses its start, with a warning."""
    long = _tone(tmp_path / "long.wav", 300.0)  # five minutes: 19 MB of float32 if read whole
    with pytest.raises(AudioError, match=r"long.wav: reference audio is longer than 30 s; .* or set x_vector_only"):
        load_reference(long, 24000)
    tracemalloc.start()
    try:
        with pytest.warns(UserWarning, match="its first 30 s are used"):
            wav = load_reference(long, 24000, truncate=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(wav) == MAX_REFERENCE_SECONDS * 24000
    assert peak < 12 * 2**20, peak  # ~30 s read and resampled, never the whole file
    exact = _tone(tmp_path / "exact.wav", MAX_REFERENCE_SECONDS)
    assert len(load_reference(exact, 16000)) == MAX_REFERENCE_SECONDS * 16000  # the limit itself is fine
    with pytest.raises(AudioError, match="is a directory, not an audio file"):
        load_reference(tmp_path, 24000)


def test_validate_names_a_too_long_reference_and_the_api_follows_the_same_rule(tts_factory, ckpt_dir, tmp_path):
    from omnitts.batch.manifest import check_manifest
    from omnitts.config import load_config

    _tone(tmp_path / "long.wav", MAX_REFERENCE_SECONDS + 5)
    _tone(tmp_path / "ok.wav", 2.0)
    lines = [{"id": "icl", "text": "Hi.", "ref_audio": "long.wav", "ref_text": "Words."},
             {"id": "xvec", "text": "Hi.", "ref_audio": "long.wav", "x_vector_only": True},
             {"id": "dir", "text": "Hi.", "ref_audio": ".", "x_vector_only": True},
             {"id": "fine", "text": "Hi.", "ref_audio": "ok.wav", "ref_text": "Words."}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    items, bad = check_manifest(tmp_path / "m.jsonl", load_config(ckpt_dir("base")))
    assert [item.request.id for item in items] == ["xvec", "fine"]
    problems = {b.line: b.message for b in bad}
    assert "ref_audio" in problems[1]
    assert "long.wav is 35.0 s long; in-context cloning takes at most 30 s" in problems[1]
    assert "a directory, not an audio file" in problems[3]
    tts = tts_factory("base")
    with pytest.raises(AudioError, match="longer than 30 s"):
        tts.clone_voice(tmp_path / "long.wav", "Words.")
    with pytest.warns(UserWarning, match="first 30 s"):
        voice = tts.clone_voice(tmp_path / "long.wav", x_vector_only=True)
    assert voice.meta["ref_seconds"] == f"{MAX_REFERENCE_SECONDS:.3f}"


def test_ids_with_control_characters_are_refused_and_a_bom_is_ignored(ckpt_dir, tmp_path):
    from omnitts.batch.manifest import check_manifest
    from omnitts.config import load_config

    lines = [{"id": name, "text": "Hi.", "speaker": "ryan"} for name in ("first", "nl\n", "tab\tx")]
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(line) + "\n" for line in lines).encode())
    items, bad = check_manifest(manifest, load_config(ckpt_dir("custom_voice")))
    assert [item.request.id for item in items] == ["first"]  # the BOM did not cost the first line
    assert [b.line for b in bad] == [2, 3] and all("is not a safe file name" in b.message for b in bad)


def test_a_torn_last_line_is_closed_before_the_next_record(tmp_path):
    from omnitts.batch.ledger import Ledger, read_results

    log = tmp_path / "results.jsonl"
    log.write_text(json.dumps({"id": "a", "status": "error", "error": "x"}) + "\n" + '{"id": "b", "stat')
    Ledger(tmp_path).write({"id": "c", "status": "error", "error": "y"})
    assert set(read_results(tmp_path)) == {"a", "c"}  # "c" was not glued to the torn "b" line
    assert log.read_text().endswith('"stat\n' + json.dumps({"id": "c", "status": "error", "error": "y"}) + "\n")


def test_a_whole_last_record_without_its_newline_counts_for_every_reader(tmp_path):
    """Saved by hand in an editor that adds no final newline: resume, export and read_results all take it."""
    from omnitts.batch.ledger import Ledger, read_results

    log = tmp_path / "results.jsonl"
    log.write_text(json.dumps({"id": "a", "status": "error", "error": "x"}) + "\n"
                   + json.dumps({"id": "b", "status": "error", "error": "y"}))
    ledger = Ledger(tmp_path)
    assert set(read_results(tmp_path)) == set(ledger.failed) == {"a", "b"}
    ledger.write({"id": "c", "status": "error", "error": "z"})
    assert set(read_results(tmp_path)) == set(Ledger(tmp_path).failed) == {"a", "b", "c"}
    assert log.read_text().count("\n") == 3  # "c" went on a line of its own


def test_nothing_is_written_through_a_linked_log_and_only_omnitts_temporaries_are_deleted(ckpt_dir, tmp_path):
    from typer.testing import CliRunner

    from omnitts.batch.claims import sweep
    from omnitts.cli import app
    from omnitts.io.atomic import is_temp_name, temp_name

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere.jsonl"
    out.mkdir()
    elsewhere.write_text("precious\n")
    (out / "results.jsonl").symlink_to(elsewhere)
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "a", "text": "Hi.", "speaker": "ryan"}) + "\n")
    args = ["synth", str(tmp_path / "m.jsonl"), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
            "--max-frames", "3", "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "results.jsonl: is a symbolic link" in result.output
    assert elsewhere.read_text() == "precious\n" and not (out / "a.wav").exists()
    (out / "results.jsonl").unlink()
    mine = Path(temp_name(out / "a.wav"))  # this process's: a live writer's file, kept
    assert is_temp_name(mine.name) and mine.name.startswith(".a.wav.omnitts-")
    dead = out / ".b.wav.omnitts-deadbeef-abcdefgh.tmp"  # a writer without a live lock: deleted
    old = out / ".c.wav.omnitts-abcdefgh.tmp"  # named before writer tokens: deleted
    dead.write_bytes(b"x")
    old.write_bytes(b"x")
    (out / ".notes.tmp").write_text("a user's file")
    (out / ".x.tmp").mkdir()
    (out / ".link.omnitts-abcdefgh.tmp").symlink_to(elsewhere)
    assert sweep(out) == 2 and not dead.exists() and not old.exists() and mine.exists()
    mine.unlink()
    assert (out / ".notes.tmp").read_text() == "a user's file" and (out / ".x.tmp").is_dir()
    assert (out / ".link.omnitts-abcdefgh.tmp").is_symlink() and elsewhere.read_text() == "precious\n"
    result = CliRunner().invoke(app, args)  # a directory named like a temporary file does not stop a run
    assert result.exit_code == 0, result.output
    assert (out / "a.wav").is_file() and (out / ".notes.tmp").exists()
