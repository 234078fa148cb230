"""Deterministic mode (`omnitts.load(deterministic=True)`, `--deterministic`): on a graph device every frame runs
at the engine's full batch, graphs and eager, with the engine sized to max_batch however few lines are left;
the codec decodes one stream per call; the decode attention is the row-invariant kernel (its Triton side is
tested in test_fused.py); the CPU changes nothing (its paths are batch-invariant as they are); an NPU and
contradicting options are refused with a clear message."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from omnitts.api import TTS
from omnitts.cli import app
from omnitts.device import fused, make_deterministic
from omnitts.device.fake import FakeGraphBackend
from omnitts.errors import OmniTTSError
from omnitts.models import layers

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

TEXTS = ["Short one.", "A somewhat longer sentence for the batch.", "你好，今天怎么样？"]


@pytest.fixture(scope="module")
def cv(tts_factory):
    return tts_factory("custom_voice", max_batch=4)


def _fake_device(monkeypatch, eager: bool = False):
    """Engines and the pipeline's codec get the CPU fake of device graphs; returns the backends made."""
    from omnitts.engine import engine as engine_module
    from omnitts.engine import pipeline as pipeline_module

    made = []

    def fake(name, eager_flag=False, **_):
        made.append(FakeGraphBackend(eager=eager or eager_flag))
        return made[-1]

    monkeypatch.setattr(engine_module, "get_backend", lambda name, eager=False: fake(name, eager))
    monkeypatch.setattr(pipeline_module, "get_backend", lambda name, eager=False: fake(name, eager))
    return made


@pytest.mark.parametrize("eager", [False, True])
def test_every_frame_runs_the_full_batch_and_the_codec_one_stream_a_call(cv, monkeypatch, eager):
    """Three lines, max_batch 4, on the fake graph device: the engine has 4 slots (not 3: the run's size
    must not change the shapes), every frame runs 4 rows (one graph bucket, or eager frames padded), the
    codec's calls are one row each, behind the frames; codes and audio are the normal run's (the CPU's
    arithmetic does not depend on the batch)."""
    from omnitts.engine.runner import ModelRunner
    from omnitts.models.codec_streams import _Call

    normal = cv.synthesize(TEXTS, speaker="ryan", greedy=True, max_frames=30)
    made = _fake_device(monkeypatch, eager)
    rows, calls = [], []
    frame, run = ModelRunner.frame, _Call.run
    monkeypatch.setattr(ModelRunner, "frame", lambda self, batch, span, *a: (rows.append(batch),
                                                                              frame(self, batch, span, *a))[1])
    monkeypatch.setattr(_Call, "run", lambda self: (calls.append(self.rows), run(self))[1])
    tts = TTS(cv.ckpt, max_batch=4, deterministic=True)
    try:
        got = tts.synthesize(TEXTS, speaker="ryan", greedy=True, max_frames=30)
        engine = tts.idle_engine
        assert (engine is None) == eager  # graphs: parked for the next call
        if not eager:
            assert engine.config.max_num_seqs == 4 and engine.config.full_batch
            sizes = {size for steps in engine.steps.values() for size, _ in steps.graphs}
            assert sizes == {4}
    finally:
        tts.release_engine()
    assert rows and set(rows) == {4}  # eager frames padded to the full batch; graphs captured at it
    assert calls and set(calls) == {1}
    assert made and all(b.eager == eager for b in made)  # the fake device really ran, as asked
    assert eager or all(graph.replays for b in made for graph in b.captured)
    for a, b in zip(got, normal):
        np.testing.assert_array_equal(a.codes, b.codes)
        assert a.audio.shape == b.audio.shape and np.abs(a.audio - b.audio).max() <= 1e-5


def test_on_the_cpu_only_the_codec_changes(cv, monkeypatch):
    """On the CPU the frames stay as they are (no padding rows: they are batch-invariant already); the codec
    decodes one stream per call, unpadded, so a line's samples, not only its codes, are the same whoever runs
    beside it; the codes are the plain run's."""
    from omnitts.engine.pipeline import Pipeline
    from omnitts.models.codec_stream import StreamingCodec

    tts = TTS(cv.ckpt, max_batch=4, deterministic=True)
    pipeline = Pipeline(tts)
    assert tts.deterministic and not pipeline.full_batch and not pipeline.audio.codec.fixed
    assert pipeline.audio.codec.max_rows == 1 and pipeline.audio.codec.gather == 0
    rows = []
    step = StreamingCodec.step
    monkeypatch.setattr(StreamingCodec, "step", lambda self, codes, *a: (rows.append(codes.shape[0]),
                                                                          step(self, codes, *a))[1])
    got = tts.synthesize(TEXTS, speaker="ryan", greedy=True, max_frames=30)
    assert rows and set(rows) == {1}
    for a, b in zip(got, cv.synthesize(TEXTS, speaker="ryan", greedy=True, max_frames=30)):
        np.testing.assert_array_equal(a.codes, b.codes)


def test_contradicting_options_and_an_npu_are_refused(cv, ckpt_dir):
    import omnitts

    with pytest.raises(OmniTTSError, match="graph_buckets do not apply"):
        TTS(cv.ckpt, max_batch=4, deterministic=True, graph_buckets=[1, 2])
    with pytest.raises(OmniTTSError, match="graph_buckets do not apply"):
        omnitts.load(ckpt_dir("custom_voice"), deterministic=True, graph_buckets=[2])
    with pytest.raises(OmniTTSError, match="not available on npu"):
        omnitts.load(ckpt_dir("custom_voice"), device="npu", deterministic=True)
    with pytest.raises(OmniTTSError, match="not available on npu"):
        make_deterministic(cv.ckpt.model.talker, types.SimpleNamespace(type="npu"))  # torch.device needs torch_npu


def test_cuda_gets_the_invariant_attention_only_after_its_check_passes(cv, monkeypatch):
    """`make_deterministic` on CUDA: a failed kernel check is an error naming it (never a silent fallback); a
    passed one sets both decoder stacks' attention and cuDNN's deterministic switches. (The check itself
    runs the real kernel: test_fused.py.)"""
    talker = cv.ckpt.model.talker
    saved = (talker.model.attend, talker.code_predictor.model.attend, torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark)
    try:
        monkeypatch.setattr(fused, "deterministic_check", lambda device, dtype: "decode_attention: row 2 differs")
        with pytest.raises(OmniTTSError, match="row 2 differs"):
            make_deterministic(talker, torch.device("cuda"))
        assert talker.model.attend is saved[0]
        monkeypatch.setattr(fused, "deterministic_check", lambda device, dtype: None)
        make_deterministic(talker, torch.device("cuda"))
        assert talker.model.attend is talker.code_predictor.model.attend is fused.deterministic_attention
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        talker.model.attend, talker.code_predictor.model.attend = saved[:2]
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_deterministic_attention_routes_decode_to_the_row_kernel_and_the_rest_to_sdpa(dtype):
    """One query per row: the lengths are the prefix masks' counts (or the whole cache without a mask), and
    the result is the masked sdpa's (off CUDA the op is that torch code); prefill calls keep sdpa as is."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 1, 32, generator=g).to(dtype)
    k, v = torch.randn(3, 2, 40, 32, generator=g).to(dtype), torch.randn(3, 2, 40, 32, generator=g).to(dtype)
    positions = torch.tensor([0, 17, 39])
    mask = (torch.arange(40)[None, :] <= positions[:, None])[:, None, None]
    seen = []
    real = fused.OPS.decode_attention

    class Spy:
        def decode_attention(self, *args):
            seen.append(args[3].tolist())
            return real(*args)

    original, fused.OPS = fused.OPS, Spy()
    try:
        got = fused.deterministic_attention(q, k, v, mask, False)
        whole = fused.deterministic_attention(q, k, v, None, False)
        prefill = fused.deterministic_attention(q.expand(3, 4, 5, 32), k, v, None, True)
    finally:
        fused.OPS = original
    assert seen == [[1, 18, 40], [40, 40, 40]]
    assert torch.equal(got, layers.grouped_decode_attention(q, k, v, mask, False))
    assert torch.equal(whole, layers.grouped_decode_attention(q, k, v, None, False))
    assert torch.equal(prefill, layers.grouped_decode_attention(q.expand(3, 4, 5, 32), k, v, None, True))


def test_the_flag_and_the_recipe_key_run_on_the_cpu(ckpt_dir, tmp_path):
    """`--deterministic` and a recipe's `deterministic = true` are accepted, and the CPU run's codes are the
    plain run's."""
    rows = [{"id": f"l{i}", "text": TEXTS[i], "language": "english", "speaker": "ryan"} for i in range(2)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "r.toml"
    recipe.write_text("deterministic = true\n")
    base = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "--dtype", "float32", "--greedy",
            "--max-frames", "8", "--save-codes", "-q"]
    outs = {}
    for name, extra in (("plain", []), ("flag", ["--deterministic"]), ("recipe", ["--recipe", str(recipe)])):
        result = CliRunner().invoke(app, [*base, *extra, "-o", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        outs[name] = [np.load(tmp_path / name / f"l{i}.codes.npy") for i in range(2)]
    for name in ("flag", "recipe"):
        for a, b in zip(outs[name], outs["plain"]):
            np.testing.assert_array_equal(a, b)
    bad = tmp_path / "bad.toml"
    bad.write_text('deterministic = "yes"\n')
    result = CliRunner().invoke(app, [*base, "--recipe", str(bad), "-o", str(tmp_path / "bad")])
    assert result.exit_code == 2 and "deterministic: expected true or false" in result.output


def test_the_gpu_check_script_runs_and_fails_on_a_differing_line(load_script, tmp_path, capsys):
    """scripts/check_deterministic.py (the GPU lease's check) runs end to end on the CPU and passes; its
    comparison names a line whose codes or samples differ."""
    import soundfile as sf

    script = load_script("check_deterministic")
    assert script.main(["--lines", "3", "--max-batch", "2", "--modes", "deterministic", "--work",
                        str(tmp_path / "w")]) == 0
    assert "deterministic: 3/3 lines with the same codes, 3/3 with the same samples" in capsys.readouterr().out
    a, b = tmp_path / "w" / "deterministic-a", tmp_path / "w" / "deterministic-b"
    codes = np.load(b / "line1.codes.npy")
    codes[-1, 3] += 1
    np.save(b / "line1.codes.npy", codes)
    audio, rate = sf.read(b / "line2.wav", dtype="int16")
    audio[100] += 1
    sf.write(b / "line2.wav", audio, rate, subtype="PCM_16")
    assert script.compare(a, b, ["line0", "line1", "line2"]) == (2, 2, ["line1", "line2"])


def test_an_engine_smaller_than_max_batch_is_warned_about(cv, monkeypatch):
    """Lines so long that max_batch rows do not fit the K/V budget get a smaller engine, whose shapes differ:
    deterministic mode says so once (the codes of such lines are not covered)."""
    _fake_device(monkeypatch)
    tts = TTS(cv.ckpt, max_batch=4, deterministic=True)
    tcfg = cv.ckpt.config.talker
    per_position = 2 * tcfg.num_hidden_layers * tcfg.num_key_value_heads * tcfg.head_dim * cv.ckpt.cache_dtype.itemsize
    tts.kv_budget_bytes = 2 * 64 * per_position  # two slots of 64 positions
    try:
        with pytest.warns(RuntimeWarning, match="fit only 2 of max_batch 4 rows"):
            tts.synthesize(TEXTS, speaker="ryan", greedy=True, max_frames=20)
    finally:
        tts.release_engine()


def test_a_refused_capture_still_runs_the_full_batch(cv, monkeypatch):
    """A device that refuses to capture falls back to eager frames; in deterministic mode those run the
    bucket's (the full batch's) rows too, so the fallback keeps the promise."""
    from omnitts.engine import engine as engine_module
    from omnitts.engine.runner import ModelRunner

    class Refusing(FakeGraphBackend):
        capture_fallback = True

        def new_graph(self, *args):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(engine_module, "get_backend", lambda name, eager=False: Refusing(eager=eager))
    rows = []
    frame = ModelRunner.frame
    monkeypatch.setattr(ModelRunner, "frame", lambda self, batch, span, *a: (rows.append(batch),
                                                                              frame(self, batch, span, *a))[1])
    tts = TTS(cv.ckpt, max_batch=4, deterministic=True)
    from omnitts.engine import pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "get_backend", lambda name, eager=False: Refusing(eager=eager))
    with pytest.warns(RuntimeWarning, match="graph capture failed"):
        got = tts.synthesize(TEXTS[:2], speaker="ryan", greedy=True, max_frames=12)
    tts.release_engine()
    assert rows and set(rows) == {4}
    for a, b in zip(got, cv.synthesize(TEXTS[:2], speaker="ryan", greedy=True, max_frames=12)):
        np.testing.assert_array_equal(a.codes, b.codes)
