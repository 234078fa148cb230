"""`dtype="auto"`: bfloat16 only where bf16 is native, decided from the CPU's flags at run time."""

from __future__ import annotations

import types

import pytest
import torch

import omnitts
from omnitts.device import features

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512_NO_BF16 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512_vnni"}
ZEN4 = AVX512_NO_BF16 | {"avx512_bf16"}
SAPPHIRE_RAPIDS = AVX512_NO_BF16 | {"amx_tile", "amx_bf16", "amx_int8"}


@pytest.fixture(scope="module")
def auto_in_a_module_fixture():
    return features.resolve_dtype("auto", "cpu")


def test_module_scoped_fixtures_see_the_suites_float32_auto(auto_in_a_module_fixture):
    """conftest pins `auto` to float32 for the session before any module- or session-scoped fixture is
    built (a per-test patch came after them: their models were bfloat16 on a bf16 CPU, float32 elsewhere)."""
    assert auto_in_a_module_fixture == "float32"


def test_auto_picks_float32_without_native_bf16():
    assert features.resolve_dtype("auto", "cpu", AVX2_ONLY) == "float32"
    assert features.resolve_dtype("auto", "cpu", AVX512_NO_BF16) == "float32"
    assert features.resolve_dtype("auto", "cpu", frozenset()) == "float32"  # unknown CPU: the safe choice


def test_auto_picks_bfloat16_with_native_bf16_and_on_accelerators(monkeypatch):
    assert features.resolve_dtype("auto", "cpu", ZEN4) == "bfloat16"
    assert features.resolve_dtype("auto", "cpu", SAPPHIRE_RAPIDS) == "bfloat16"
    assert features.resolve_dtype("auto", "cuda", AVX2_ONLY) == "bfloat16"
    npu = types.SimpleNamespace(current_device=lambda: 0, get_device_name=lambda index: "Ascend910B3")
    monkeypatch.setattr(torch, "npu", npu, raising=False)  # an A2-class part (older ones: test_predictor_cache)
    assert features.resolve_dtype("auto", "npu", frozenset()) == "bfloat16"


def test_explicit_dtypes_are_kept():
    for name in ("float32", "bfloat16", "float16"):
        assert features.resolve_dtype(name, "cpu", AVX2_ONLY) == name


def test_load_resolves_auto_from_the_flags(ckpt_dir, monkeypatch):
    """A simulated AVX2-only CPU loads float32 models; a simulated bf16 CPU loads bfloat16; codec float32."""
    folder = ckpt_dir("custom_voice")
    for flags, expected in ((AVX2_ONLY, torch.float32), (ZEN4, torch.bfloat16)):
        monkeypatch.setattr(features, "cpu_flags", lambda flags=flags: flags)
        tts = omnitts.load(folder, dtype="auto")
        assert tts.ckpt.dtype == expected
        assert tts.ckpt.model.talker.codec_head.weight.dtype == expected
        assert tts.ckpt.codec.pre_conv.conv.weight.dtype == torch.float32
        audio = tts.synthesize("Auto dtype.", speaker="ryan", greedy=True, max_frames=3)
        assert audio.frames == 3 and audio.samples.shape == (3 * 1920,)


def test_synth_without_a_dtype_runs_bfloat16_on_a_bf16_cpu(ckpt_dir, tmp_path, monkeypatch):
    """What a user of a bf16-capable CPU runs by default, end to end: `omnitts synth` with no --dtype, sampled,
    loads bfloat16 language models and writes every item (the rest of the suite pins `auto` to float32)."""
    import json

    import soundfile as sf
    from typer.testing import CliRunner

    from omnitts import api
    from omnitts.cli import app

    monkeypatch.setattr(features, "cpu_flags", lambda: ZEN4)
    loaded, load = [], api.load
    monkeypatch.setattr(api, "load", lambda *args, **kwargs: loaded.append(load(*args, **kwargs)) or loaded[-1])
    manifest, out = tmp_path / "m.jsonl", tmp_path / "out"
    rows = [{"id": "a", "text": "The default dtype.", "speaker": "ryan"},
            {"id": "b", "text": "A second item.", "speaker": "vivian", "seed": 5}]
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                      "--max-frames", "4", "--seed", "1", "-q"])
    assert result.exit_code == 0, result.output
    assert [tts.ckpt.dtype for tts in loaded] == [torch.bfloat16]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ["a", "b"] and all(r["status"] == "ok" for r in records), records
    for r in records:
        audio, rate = sf.read(out / f"{r['id']}.wav")
        assert rate == 24000 and audio.shape == (r["frames"] * 1920,) and r["frames"] > 0
