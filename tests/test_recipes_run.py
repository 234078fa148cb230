"""The shipped example manifests run end to end with `--recipe recipes/cpu.toml`, each on a tiny checkpoint
of its kind (recipes/README.md's commands; tests/test_recipe.py covers loading and precedence)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import soundfile as sf
from typer.testing import CliRunner

import omnitts.api
from omnitts.cli import app
from omnitts.recipe import load_recipe

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
FRAMES = 3


@pytest.mark.parametrize("manifest,kind,preset", [
    ("custom_voice.jsonl", "custom_voice", "tiny-1.7b"),  # it has an instruct line: 1.7B only
    ("voice_design.jsonl", "voice_design", "tiny-1.7b"),
    ("base_clone.jsonl", "base", "tiny-0.6b"),  # ref_audio "ref.wav" resolves against recipes/examples/
])
def test_example_manifest_runs_with_the_cpu_recipe(ckpt_dir, tmp_path, monkeypatch, manifest, kind, preset):
    loads, real_load = [], omnitts.api.load
    monkeypatch.setattr(omnitts.api, "load", lambda *a, **kw: loads.append(kw) or real_load(*a, **kw))
    path, out = RECIPES / "examples" / manifest, tmp_path / "out"
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    ids = [line["id"] for line in lines]
    # A line's own max_seconds is its budget (it beats --max-frames, as its seed beats --seed).
    frames = {line["id"]: round(line["max_seconds"] * 12.5) if "max_seconds" in line else FRAMES for line in lines}
    result = CliRunner().invoke(app, ["synth", str(path), "-m", str(ckpt_dir(kind, preset)), "-o", str(out),
                                      "--recipe", str(RECIPES / "cpu.toml"), "--max-frames", str(FRAMES), "-q"])
    assert result.exit_code == 0, result.output
    (settings,) = loads  # the recipe's engine settings reached the load
    assert load_recipe(RECIPES / "cpu.toml").engine_options().items() <= settings.items()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(ids) and all(r["status"] == "ok" for r in records)
    for r in records:
        info = sf.info(out / r["path"])
        assert info.samplerate == 24000 and info.frames == frames[r["id"]] * 1920, r
