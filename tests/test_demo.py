"""`omnitts demo --kind`: a tiny checkpoint of each kind, built and run end to end."""

from __future__ import annotations

import json

import pytest
import soundfile as sf
from typer.testing import CliRunner

from omnitts.cli import DEMO_LINES, app


@pytest.mark.parametrize("kind", ["voice_design", "base"])
def test_demo_runs_each_kind(tmp_path, kind):
    out, model = tmp_path / "out", tmp_path / "ckpt"
    result = CliRunner().invoke(app, ["demo", "--kind", kind, "-o", str(out), "--model-dir", str(model)])
    assert result.exit_code == 0, result.output
    assert json.loads((model / "config.json").read_text())["tts_model_type"] == kind
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records if r["status"] == "ok") == sorted(line["id"] for line in DEMO_LINES[kind])
    assert all(sf.info(out / r["path"]).frames == 25 * 1920 for r in records)


def test_demo_rejects_an_unknown_kind(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--kind", "opera", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "--kind 'opera': choose custom_voice, voice_design, base" in result.output
