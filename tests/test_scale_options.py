"""Every synth option keeps its meaning under --shard, --workers and --ray: the same files, records and export
as one process, with format, loudness, splitting, codes, a seed and a dataset export all at once."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from omnitts.batch.ledger import read_results
from omnitts.cli import app

ROWS = [
    {"id": "long", "text": "This one is split. It has two sentences, so it runs as pieces.", "speaker": "ryan"},
    {"id": "seeded", "text": "A line with its own seed.", "speaker": "ryan", "seed": 5},
    {"id": "budget", "text": "A line with its own budget.", "speaker": "ryan", "max_seconds": 0.4},
    {"id": "plain", "text": "Plain words here.", "speaker": "ryan"},
    {"id": "other", "text": "One more line to share out.", "speaker": "ryan"},
]
OPTIONS = ["--no-greedy", "--seed", "3", "--max-frames", "9", "--format", "flac", "--loudness", "-23",
           "--split-chars", "20", "--save-codes", "--dtype", "float32", "--max-batch", "3", "-q"]


def _synth(manifest, ckpt, out, *extra):
    result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt), "-o", str(out), *OPTIONS,
                                      "--export-dataset", str(out.parent / f"{out.name}-ds"), *extra])
    assert result.exit_code == 0, result.output
    return result


def _outputs(out):
    """What a run leaves: each id's record (the parts that must not depend on the way it ran), samples, codes."""
    keep = ("status", "path", "samples", "frames", "seed", "seeds", "pieces", "fingerprint", "finish_reason")
    records = {i: {k: r[k] for k in keep} for i, r in read_results(out).items()}
    audio = {i: sf.read(str(out / f"{i}.flac"), dtype="int16")[0].astype(np.int32) for i in records}
    codes = {i: np.load(out / f"{i}.codes.npy") for i in records}
    return records, audio, codes


def _export(folder):
    from datasets import load_from_disk

    ds = load_from_disk(str(folder))
    return sorted((row["id"], row["text"], row["seconds"], row["frames"], row["seed"]) for row in ds)


@pytest.mark.parametrize("how", ["shards", "workers", pytest.param("ray", marks=pytest.mark.slow)])
def test_options_mean_the_same_under_every_way_to_scale(ckpt_dir, tmp_path, how):
    if how == "ray":
        pytest.importorskip("ray")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    ckpt = ckpt_dir("custom_voice")
    _synth(manifest, ckpt, tmp_path / "one")
    scaled = tmp_path / "scaled"
    if how == "shards":
        _synth(manifest, ckpt, scaled, "--shard", "0/2")
        _synth(manifest, ckpt, scaled, "--shard", "1/2")
        # each shard exported its own items; a plain re-run (everything done) exports them all
        result = _synth(manifest, ckpt, scaled)
        assert "5 items already done" in result.output
    elif how == "workers":
        _synth(manifest, ckpt, scaled, "--workers", "2")
    else:
        _synth(manifest, ckpt, scaled, "--ray", "--workers", "2")
    one, other = _outputs(tmp_path / "one"), _outputs(scaled)
    assert one[0] == other[0]  # records: fingerprints, seeds, pieces, lengths
    assert one[0]["long"]["pieces"] > 1 and one[0]["budget"]["frames"] <= 5  # the options did act
    for i in one[0]:
        assert np.array_equal(one[2][i], other[2][i]), i  # the codes: bitwise
        # the samples: decoded among other streams, within one 16-bit step (docs/determinism.md)
        assert one[1][i].shape == other[1][i].shape and np.abs(one[1][i] - other[1][i]).max() <= 1, i
    assert _export(tmp_path / "one-ds") == _export(tmp_path / "scaled-ds")


@pytest.mark.parametrize("how", ["workers", pytest.param("ray", marks=pytest.mark.slow)])
def test_force_redoes_every_item_once_across_workers(ckpt_dir, tmp_path, how):
    """--force with several engines: each item redone exactly once, though every worker opens the directory
    after the run began (and after others may have redone items already)."""
    if how == "ray":
        pytest.importorskip("ray")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    ckpt, out = ckpt_dir("custom_voice"), tmp_path / "out"
    flags = ["--greedy", "--max-frames", "6", "--dtype", "float32", "-q", "--workers", "2"]
    flags += ["--ray"] if how == "ray" else []
    for extra in ([], ["--force"]):
        result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt), "-o", str(out), *flags, *extra])
        assert result.exit_code == 0, result.output
    lines = [json.loads(line)["id"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(lines) == sorted([r["id"] for r in ROWS] * 2)
