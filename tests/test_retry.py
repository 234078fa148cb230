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


def test_a_failed_item_is_retried_only_with_the_flag(ckpt_dir, tts_factory, ref_wav, tmp_path):
    # "voiced" fails at synthesis time (validation checks only that its voice file exists): the file is
    # no saved voice. Then the user replaces it with a good one and runs the same command again.
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
    (failed,) = [r for r in _records(out) if r["id"] == "voiced"]
    assert "not a saved voice" in failed["error"] and not (out / "voiced.wav").exists()

    tts_factory("base").clone_voice(ref_wav, x_vector_only=True).save(tmp_path / "v.safetensors")

    again = runner.invoke(app, args)  # without the flag: not run (its exit code and summary: tests/test_cli.py)
    assert again.exception is None or isinstance(again.exception, SystemExit), again.output
    assert len(_records(out)) == 2 and not (out / "voiced.wav").exists()

    retried = runner.invoke(app, args + ["--retry-failed"])
    assert retried.exit_code == 0, retried.output
    records = _records(out)
    assert _statuses(out) == {"plain": ["ok"], "voiced": ["error", "ok"]}
    assert records[-1]["path"] == "voiced.wav" and sf.info(out / "voiced.wav").frames == 4 * 1920

    done = runner.invoke(app, args + ["--retry-failed"])  # now done: neither item runs again
    assert done.exit_code == 0 and len(_records(out)) == 3, done.output
