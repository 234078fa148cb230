"""`omnitts synth --loudness`: written files measure at the target, peaks under -1 dBFS."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from omnitts.cli import app
from omnitts.io.loudness import DEFAULT_CEILING, integrated_loudness

runner = CliRunner()


def test_synth_loudness_normalizes_each_written_file(ckpt_dir, tmp_path):
    pyln = pytest.importorskip("pyloudnorm")  # the cross-check only; the refusal below runs without it
    manifest = tmp_path / "m.jsonl"
    rows = [{"id": "a", "text": "First line.", "speaker": "ryan"},
            {"id": "b", "text": "Second line.", "speaker": "vivian", "seed": 3}]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    base = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "--max-frames", "25", "--seed", "1", "-q"]
    # -23: plain gain; -10: the tiny model's ~10 dB crest factor puts peaks over -1 dBFS, so the limiter acts.
    for target in (-23.0, -10.0):
        out = tmp_path / f"out{target}"
        result = runner.invoke(app, base + ["-o", str(out), "--loudness", str(target)])
        assert result.exit_code == 0, result.output
        for name in ("a", "b"):
            audio, rate = sf.read(out / f"{name}.wav")
            assert audio.shape == (25 * 1920,)
            assert integrated_loudness(audio, rate) == pytest.approx(target, abs=0.5)
            assert pyln.Meter(rate).integrated_loudness(audio) == pytest.approx(target, abs=0.5)
            assert np.abs(audio).max() <= DEFAULT_CEILING + 1 / 32768  # 16-bit rounding

def test_synth_loudness_out_of_range_is_refused(ckpt_dir, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "text": "Hi.", "speaker": "ryan"}) + "\n", encoding="utf-8")
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o",
                                 str(tmp_path / "o"), "--loudness", "3"])
    assert result.exit_code == 2 and "--loudness" in result.output
    assert not (tmp_path / "o").exists()
