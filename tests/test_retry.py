"""`synth --retry-failed`: an item that failed in an earlier run is retried only when asked."""

from __future__ import annotations

import json

import soundfile as sf
from typer.testing import CliRunner

from omnitts.cli import app

runner = CliRunner()


def _records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _statuses(out) -> dict[str, list[str]]:
    """id -> the statuses of its records, oldest first (records come in finishing order)."""
    statuses: dict[str, list[str]] = {}
    for r in _records(out):
        statuses.setdefault(r["id"], []).append(r["status"])
    return statuses


def test_a_failed_item_is_retried_only_with_the_flag(ckpt_dir, tmp_path, monkeypatch):
    """A failure whose line did not change (a transient fault) is not run again by a plain re-run, only
    with --retry-failed; then it is done and nothing runs again."""
    from omnitts.api import TTS

    prepare = TTS.prepare

    def flaky(self, request):
        if request.text == "Fails once.":
            raise RuntimeError("the disk hiccuped")
        return prepare(self, request)

    rows = [{"id": "plain", "text": "Fine from the start.", "speaker": "ryan"},
            {"id": "flaky", "text": "Fails once.", "speaker": "ryan"}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    args = ["synth", str(tmp_path / "m.jsonl"), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--greedy",
            "--max-frames", "4", "-q"]
    with monkeypatch.context() as patch:
        patch.setattr(TTS, "prepare", flaky)
        first = runner.invoke(app, args)
    assert first.exit_code == 1, first.output
    assert _statuses(out) == {"plain": ["ok"], "flaky": ["error"]}
    (failed,) = [r for r in _records(out) if r["id"] == "flaky"]
    assert failed["error"] == "RuntimeError while preparing: the disk hiccuped" and not (out / "flaky.wav").exists()

    again = runner.invoke(app, args)  # without the flag: not run (its exit code and summary: tests/test_cli.py)
    assert again.exit_code == 1 and len(_records(out)) == 2 and not (out / "flaky.wav").exists(), again.output

    retried = runner.invoke(app, args + ["--retry-failed"], env={"COLUMNS": "200"})
    assert retried.exit_code == 0, retried.output
    assert "run again" not in retried.output, retried.output  # a failure tried again as it was: nothing changed
    records = _records(out)
    assert _statuses(out) == {"plain": ["ok"], "flaky": ["error", "ok"]}
    assert records[-1]["path"] == "flaky.wav" and sf.info(out / "flaky.wav").frames == 4 * 1920

    done = runner.invoke(app, args + ["--retry-failed"])  # now done: neither item runs again
    assert done.exit_code == 0 and len(_records(out)) == 3, done.output


def test_a_failed_item_whose_voice_file_was_fixed_runs_again_by_itself(ckpt_dir, tts_factory, ref_wav, tmp_path):
    """The voice file's contents are part of the line's fingerprint: replacing a broken file with a good
    one is a changed input, which a plain re-run runs (no --retry-failed needed)."""
    (tmp_path / "v.safetensors").write_bytes(b"not a voice")
    rows = [{"id": "plain", "text": "Fine from the start.", "ref_audio": str(ref_wav), "x_vector_only": True},
            {"id": "voiced", "text": "Read by the saved voice.", "voice": "v.safetensors"}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    args = ["synth", str(tmp_path / "m.jsonl"), "-m", str(ckpt_dir("base")), "-o", str(out), "--greedy",
            "--max-frames", "4", "-q"]
    first = runner.invoke(app, args)
    assert first.exit_code == 1, first.output
    assert _statuses(out) == {"plain": ["ok"], "voiced": ["error"]}
    assert "not a saved voice" in next(r for r in _records(out) if r["id"] == "voiced")["error"]
    unchanged = runner.invoke(app, args)
    assert unchanged.exit_code == 1 and len(_records(out)) == 2, unchanged.output
    tts_factory("base").clone_voice(ref_wav, x_vector_only=True).save(tmp_path / "v.safetensors")
    fixed = runner.invoke(app, args)
    assert fixed.exit_code == 0, fixed.output
    assert _statuses(out) == {"plain": ["ok"], "voiced": ["error", "ok"]}
    assert sf.info(out / "voiced.wav").frames == 4 * 1920
