"""scripts/bench_lib.py and scripts/bench_probe.py: the workload, the fits, the roofline figures and the
child processes, on tiny checkpoints (the benchmark itself is run by hand: scripts/bench.py --quick)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench_lib as lib  # noqa: E402


def test_manifest_budgets_become_exact_frame_budgets(tmp_path, tts_factory):
    items = lib.manifest_items(64, 20, 200)
    assert sorted(it["frames"] for it in items) == [int(round(20 + 180 * i / 63)) for i in range(64)]
    assert len({it["id"] for it in items}) == 64 and len({it["text"] for it in items}) > 1
    path = tmp_path / "m.jsonl"
    lib.write_manifest(items, path)
    tts = tts_factory("custom_voice")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # omnitts turns max_seconds into the frame budget; it must come back as exactly the item's frames
    got = [tts.default_params(True).with_budget(10, line["max_seconds"]).max_frames for line in lines]
    assert got == [it["frames"] for it in items]


def test_resolve_dtype():
    assert lib.resolve_dtype("auto", ["avx2", "avx512_bf16"]) == "bfloat16"
    assert lib.resolve_dtype("auto", ["amx_bf16"]) == "bfloat16"
    assert lib.resolve_dtype("auto", ["avx2", "avx512f"]) == "float32"
    assert lib.resolve_dtype("float32", ["amx_bf16"]) == "float32"


def test_fit_line_recovers_intercept_and_slope():
    a, b = lib.fit_line([(10, 2.5 + 0.7 * 10), (30, 2.5 + 0.7 * 30), (20, 2.5 + 0.7 * 20)])
    assert a == pytest.approx(2.5) and b == pytest.approx(0.7)


def test_frame_bytes_and_flops(tts_factory):
    f32 = lib.frame_bytes(tts_factory("custom_voice"))
    bf16 = lib.frame_bytes(tts_factory("custom_voice", dtype="bfloat16"))
    parts = f32["talker"] + f32["predictor_passes"] * f32["predictor_per_pass"] + f32["lm_heads"] + f32["codec_head"]
    assert f32["total"] == parts and f32["predictor_passes"] == 15
    assert bf16["total"] * 2 == f32["total"]  # every weight counted is a bf16 weight there
    tts = tts_factory("custom_voice")
    one = lib.frame_flops(tts, 1)
    assert lib.frame_flops(tts, 8) == 8 * one
    assert one >= 2 * f32["total"] / 4 * 0.95  # each weight read is used at least once per row (norms aside)


def test_engine_steps_and_batch1_run(tts_factory):
    tts = tts_factory("custom_voice", max_batch=4)
    assert lib.omnitts_steps(tts, 3, ["One text.", "Another text here."], warm=1, timed=2) > 0
    assert lib.omnitts_steps(tts, 2, ["One text."], warm=1, timed=1, rounds=5) > 0  # the budget covers 5 rounds
    b1 = lib.omnitts_batch1(tts, "A short line.", (2, 4), warm=1)
    assert [f for f, _ in b1["walls"]] == [2, 4]
    pairs = lib.roofline_pairs(tts, ["A short line."], warm=1, timed=3, nbytes=1 << 20)
    assert pairs["pairs"] == 3 and pairs["ms_per_step"] > 0 and pairs["read_gbs"] > 0
    # the fraction is the frame's weight bytes over one step's time, against that moment's bandwidth
    implied = lib.frame_bytes(tts)["total"] / (pairs["ms_per_step"] / 1000) / (pairs["read_gbs"] * 1e9)
    assert 0.2 * implied < pairs["fraction"] < 5 * implied


def test_first_frame_probe(ckpt_dir):
    out = lib.first_frame(ckpt_dir("custom_voice"), "float32", "Hello there.", repeats=2)
    assert all(out[k] >= 0 for k in ("python_start", "imports", "load", "first_frame"))
    assert out["total"] == pytest.approx(out["python_start"] + out["imports"] + out["load"] + out["first_frame"])
    assert len(out["totals"]) == 2 and out["total"] == min(out["totals"])
    assert out["total"] <= out["process_wall"]


def test_synth_probe_times_the_cli(tmp_path, ckpt_dir):
    items = [{"id": "a", "text": "First.", "speaker": "ryan", "frames": 3},
             {"id": "b", "text": "Second one.", "speaker": "vivian", "frames": 5}]
    lib.write_manifest(items, tmp_path / "m.jsonl")
    run = lib.omnitts_synth(tmp_path / "m.jsonl", ckpt_dir("custom_voice"), tmp_path / "out", 2, "float32", items)
    assert run["frames"] == 8
    assert 0 < run["after_load"] < run["whole"] and 0 < run["startup"] < run["whole"]
    with pytest.raises(RuntimeError, match="expected 9"):  # a run that makes fewer frames is an error
        lib.omnitts_synth(tmp_path / "m.jsonl", ckpt_dir("custom_voice"), tmp_path / "out", 2, "float32",
                          items + [{"id": "c", "text": "x", "speaker": "ryan", "frames": 1}])
