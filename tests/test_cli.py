"""`omnitts synth` end to end on the tiny checkpoints, through typer's CliRunner."""

from __future__ import annotations

import json

import numpy as np
import soundfile as sf
from typer.testing import CliRunner

from omnitts.cli import app

runner = CliRunner()


def _manifest(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def test_synth_writes_playable_24khz_wavs_and_codes(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "a", "text": "First line.", "language": "english", "speaker": "ryan"},
        {"id": "b", "text": "Second line.", "speaker": "Vivian", "seed": 5},
    ])
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(manifest), "--model", str(ckpt_dir("custom_voice")), "--out", str(out),
                                 "--greedy", "--max-frames", "6", "--save-codes", "--quiet"])
    assert result.exit_code == 0, result.output
    for name in ("a", "b"):
        audio, rate = sf.read(out / f"{name}.wav")
        assert rate == 24000 and audio.shape == (6 * 1920,)
        codes = np.load(out / f"{name}.codes.npy")
        assert codes.dtype == np.int64 and codes.shape == (6, 16)
    assert not list(out.glob(".*.tmp"))


def test_voice_clone_manifest_resolves_relative_ref_audio(ckpt_dir, tmp_path, ref_wav):
    (tmp_path / "refs").mkdir()
    (tmp_path / "refs" / "r.wav").write_bytes(ref_wav.read_bytes())
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "icl", "text": "Clone me.", "ref_audio": "refs/r.wav", "ref_text": "Reference words."},
        {"id": "xvec", "text": "Clone me.", "ref_audio": "refs/r.wav", "x_vector_only": True},
    ])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("base")), "-o", str(tmp_path / "o"),
                                 "--greedy", "--max-frames", "5", "-q"])
    assert result.exit_code == 0, result.output
    assert sf.info(tmp_path / "o" / "xvec.wav").frames == 5 * 1920


def test_bad_lines_are_reported_recorded_and_the_rest_runs(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "ok", "text": "Fine.", "speaker": "ryan"},
        "{not json",
        {"id": "spk", "text": "Hi.", "speaker": "bob"},
        {"id": "lang", "text": "Hi.", "speaker": "ryan", "language": "elvish"},
        {"id": "ok", "text": "Duplicate id.", "speaker": "ryan"},
        {"id": "../evil", "text": "Hi.", "speaker": "ryan"},
        {"id": "extra", "text": "Hi.", "speaker": "ryan", "volume": 3},
        {"id": "clone", "text": "Hi.", "speaker": "ryan", "ref_audio": "missing.wav"},
        {"text": "No id.", "speaker": "ryan"},
    ])
    out = tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "4", "-q"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1  # some items failed
    text = result.output
    for line, needle in [(2, "malformed JSON"), (3, "speaker: 'bob' is not known"), (4, "language: 'elvish'"),
                         (5, "id: 'ok' already used on line 1"), (6, "id: '../evil' is not a safe file name"),
                         (7, "volume: unknown field"), (8, "ref_audio: file not found"), (9, "id: missing")]:
        assert f"m.jsonl:{line}: {needle}" in text, (line, text)
    assert sf.info(out / "ok.wav").frames == 4 * 1920  # the good line still ran
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["id"]: r["status"] for r in records} == {
        "ok": "ok", "line-2": "error", "spk": "error", "lang": "error", "line-5": "error", "line-6": "error",
        "extra": "error", "clone": "error", "line-9": "error"}
    assert not (out / "spk.wav").exists()
    # --strict stops before synthesis; a re-run skips what is done and does not repeat error lines.
    strict = runner.invoke(app, args + ["--strict"])
    assert strict.exit_code == 2 and len((out / "results.jsonl").read_text().splitlines()) == len(records)


def test_rerun_resumes_without_duplicates_and_redoes_broken_files(ckpt_dir, tmp_path):
    rows = [{"id": f"u{i}", "text": f"Utterance number {i}.", "speaker": "ryan"} for i in range(3)]
    manifest = _manifest(tmp_path / "m.jsonl", rows)
    out = tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "3", "-q"]
    assert runner.invoke(app, args).exit_code == 0
    (out / "u1.wav").write_bytes(b"truncated")  # a damaged output is not done
    (out / ".u2.wav.abc.tmp").write_bytes(b"leftover")  # a kill's leftover temporary file
    assert runner.invoke(app, args).exit_code == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["u0", "u1", "u2", "u1"]
    assert sf.info(out / "u1.wav").frames == 3 * 1920
    assert not list(out.glob(".*.tmp"))


def test_mode_the_checkpoint_cannot_do(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "x", "text": "Hi.", "instruct": "Loud.", "speaker": "ryan"}])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2  # nothing left to run
    assert "m.jsonl:1: instruct: 0.6B CustomVoice checkpoints take no instruction" in result.output


def test_missing_checkpoint_file_is_one_line(ckpt_dir, tmp_path):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(ckpt_dir("custom_voice"), ckpt)
    (ckpt / "model.safetensors").unlink()
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "x", "text": "Hi.", "speaker": "ryan"}])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt), "-o", str(tmp_path / "o"), "-q"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith("error: ")
    assert "model.safetensors: file not found" in result.output


def test_info_lists_speakers(ckpt_dir):
    result = runner.invoke(app, ["info", str(ckpt_dir("custom_voice"))])
    assert result.exit_code == 0 and "ryan" in result.output and "custom_voice" in result.output


def test_max_seconds_field_sets_the_budget(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "short", "text": "A line with a time limit.", "speaker": "ryan", "max_seconds": 0.4},
        {"id": "bad", "text": "Negative.", "speaker": "ryan", "max_seconds": -1},
    ])
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "-q"])
    assert result.exit_code == 1 and "m.jsonl:2: max_seconds: must be > 0" in result.output
    record = json.loads((out / "results.jsonl").read_text().splitlines()[-1])
    assert record["id"] == "short" and record["frames"] == 5 and record["finish_reason"] == "length"


def test_flac_and_ogg_outputs(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "x", "text": "Compressed output.", "speaker": "ryan"}])
    for fmt in ("flac", "ogg"):
        out = tmp_path / fmt
        result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                     "--max-frames", "4", "--format", fmt, "-q"])
        assert result.exit_code == 0, result.output
        info = sf.info(out / f"x.{fmt}")
        assert info.samplerate == 24000 and info.frames == 4 * 1920
        assert json.loads((out / "results.jsonl").read_text())["path"] == f"x.{fmt}"
    bad = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "m"),
                              "--format", "mp3"])
    assert bad.exit_code == 2 and "--format 'mp3': choose wav, flac or ogg" in bad.output


def test_bad_codec_dtype_stops_before_loading(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "x", "text": "Hi.", "speaker": "ryan"}])
    bad = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o"),
                              "--codec-dtype", "float16"])
    assert bad.exit_code == 2 and "--codec-dtype 'float16': choose float32 or bfloat16" in bad.output
    assert not (tmp_path / "o").exists()
