"""Padded prefill (issue 33): on accelerators outside float32 each admitted prompt is padded at its end to a
length bucket and prefilled by that bucket's graph (engine.runner.Prefills). Checked on the CPU fake, with
`OMNITTS_PREFILL_GRAPHS=1` (the fake runs float32, where a device would not pad): graphs = eager padded
prefills, bitwise; the padding cannot reach a prompt's values; one graph per bucket a run needs, one replay
per admitted prompt, no host sync; what falls back to the prompt's own shape, and when."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from omnitts.device.base import Backend
from omnitts.device.fake import FakeGraphBackend, no_host_sync
from omnitts.engine import Engine, EngineConfig
from omnitts.engine import runner as runner_module
from omnitts.request import Request

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

TEXTS = ["Short one.", "A somewhat longer sentence for the batch, with more words in it than most.",
         "你好，今天怎么样？", "Last of the group here, and a few words more."]


@pytest.fixture(scope="module")
def cv(tts_factory):
    return tts_factory("custom_voice")


@pytest.fixture(scope="module")
def prompts(cv):
    """Prompts of 9, 39, 9, 31 and 97 positions (streaming and non-streaming text): buckets 16 to 128."""
    requests = [Request(text, speaker="ryan", non_streaming=i % 2 == 1) for i, text in enumerate(TEXTS)]
    requests.append(Request(TEXTS[1] * 3, speaker="ryan", non_streaming=True))
    return [cv.prompts.build(r) for r in requests]


@pytest.fixture
def padded(monkeypatch):
    monkeypatch.setenv("OMNITTS_PREFILL_GRAPHS", "1")


def run(cv, prompts, backend, greedy, slots=3, positions=256, on_step=None):
    """Every prompt through an engine on `backend` (frame budgets 6, 9, ...); ({tag: codes}, engine)."""
    engine = Engine(cv.ckpt, EngineConfig(max_num_seqs=slots, max_positions=positions), backend=backend)
    for i, prompt in enumerate(prompts):
        engine.add(prompt, cv.default_params(greedy, max_frames=6 + 3 * i, seed=i), tag=i)
    done = {}
    while engine.has_work():
        done.update({seq.tag: seq.codes() for seq in (on_step(engine) if on_step else engine.step())})
    return done, engine


def prefill_state(cv, prompt, backend, positions=256):
    """(next logits, hidden, K of layer 0 over the prompt) of slot 1 after prefilling `prompt` into it."""
    engine = Engine(cv.ckpt, EngineConfig(max_num_seqs=2, max_positions=positions), backend=backend)
    engine.prefills.run(1, [prompt])
    n = prompt.shape[0]
    return (engine.state.logits[1].clone(), engine.state.hidden[1].clone(), engine.cache.k[0][1, :, :n].clone(),
            int(engine.state.lengths[1]))


def test_which_runs_pad_their_prefills(monkeypatch):
    monkeypatch.delenv("OMNITTS_PREFILL_GRAPHS", raising=False)
    cpu, device = Backend(eager=True), FakeGraphBackend()
    assert not cpu.pads_prefill(torch.bfloat16) and not cpu.pads_prefill(torch.float32)
    assert device.pads_prefill(torch.bfloat16) and device.pads_prefill(torch.float16)
    assert not device.pads_prefill(torch.float32)  # the parity runs keep each prompt's own shape
    monkeypatch.setenv("OMNITTS_PREFILL_GRAPHS", "1")
    assert device.pads_prefill(torch.float32) and not cpu.pads_prefill(torch.float32)
    monkeypatch.setenv("OMNITTS_PREFILL_GRAPHS", "0")
    assert not device.pads_prefill(torch.bfloat16)


@pytest.mark.parametrize("greedy", [True, False])
def test_prefill_graphs_equal_eager_padded_prefills_one_graph_per_bucket(cv, prompts, padded, greedy):
    assert [p.shape[0] for p in (q.embeds for q in prompts)] == [9, 39, 9, 31, 97]
    eager, eager_engine = run(cv, prompts, FakeGraphBackend(eager=True), greedy)
    backend = FakeGraphBackend()
    graphed, engine = run(cv, prompts, backend, greedy)
    prefills = engine.prefills
    assert eager_engine.prefills.padded == prefills.padded == 5 and prefills.alone == 0
    assert eager_engine.prefills.captures == 0 and not eager_engine.prefills.by_bucket  # --eager: no graphs
    assert sorted(prefills.by_bucket) == [16, 32, 64, 128]  # the buckets these prompts need, no other
    graphs = list(prefills.by_bucket.values())
    assert all(g is not None for g in graphs) and prefills.captures == 4
    assert sorted(g.replays for g in graphs) == [1, 1, 1, 2]  # one replay per prompt (two of 9 positions)
    stats = engine.graph_stats()
    assert stats["prefill_captures"] == 4 and stats["prefill_capture_seconds"] > 0
    assert stats["captures"] == len(backend.captured) - 4  # the frames' graphs are counted apart
    for i in eager:
        np.testing.assert_array_equal(graphed[i], eager[i], err_msg=f"request {i}")


def test_a_padded_prefill_matches_the_prompts_own_shape(cv, prompts, padded):
    """The padded prefill computes each prompt position from the same inputs as the unpadded one (causal
    attention: the padding comes after): same length, logits, hidden and keys, to float32 rounding (the
    matrix products have other shapes: ~5e-7 of each tensor's scale measured)."""
    for prompt in (p.embeds for p in prompts):
        want = prefill_state(cv, prompt, Backend(eager=True))
        for backend in (FakeGraphBackend(eager=True), FakeGraphBackend()):
            got = prefill_state(cv, prompt, backend)
            assert got[3] == want[3] == prompt.shape[0]
            for a, b in zip(got[:3], want[:3]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-6 * float(b.abs().max()))  # logits are ~400


def test_whatever_the_padding_holds_never_reaches_the_prompt_or_the_frames(cv, prompts, padded, monkeypatch):
    """Padding with large values instead of zeros changes no bit of any request's codes, nor of a prefill's
    state: a position never attends to later ones, and a frame never reads past its row's length."""
    zeros, _ = run(cv, prompts, FakeGraphBackend(), False)
    states = [prefill_state(cv, p.embeds, FakeGraphBackend()) for p in prompts]
    load = runner_module.ModelRunner.load_prefill

    def noisy(self, inputs, row, prompt, bucket):
        load(self, inputs, row, prompt, bucket)
        n = prompt.shape[0]
        inputs.embeds[0, n:bucket] = torch.linspace(-300.0, 300.0, (bucket - n) * prompt.shape[1]).view(bucket - n, -1)

    monkeypatch.setattr(runner_module.ModelRunner, "load_prefill", noisy)
    garbage, _ = run(cv, prompts, FakeGraphBackend(), False)
    for i in zeros:
        np.testing.assert_array_equal(garbage[i], zeros[i], err_msg=f"request {i}")
    for prompt, want in zip(prompts, states):
        got = prefill_state(cv, prompt.embeds, FakeGraphBackend())
        assert all(torch.equal(a, b) for a, b in zip(got[:3], want[:3]))


def test_one_prefill_replay_per_admitted_prompt_and_no_host_sync(cv, prompts, padded):
    from unittest import mock

    real_numpy, replays = torch.Tensor.numpy, []

    def replayed(engine):
        return sum(g.replays for g in engine.prefills.by_bucket.values() if g is not None)

    def step(engine):
        if not hasattr(engine, "collect"):  # `_collect` keeps its one wait, the host copy of a frame's codes
            engine.collect = engine._collect

            def waiting(pending):
                with mock.patch.object(torch.Tensor, "numpy", real_numpy):
                    return engine.collect(pending)
            engine._collect = waiting
        before, waiting_before = replayed(engine), len(engine.scheduler.waiting)
        with no_host_sync():  # admission, the prefills and the frame: the host never waits
            finished = engine.step()
        replays.append((waiting_before - len(engine.scheduler.waiting), replayed(engine) - before))
        return finished

    done, _ = run(cv, prompts, FakeGraphBackend(), True, on_step=step)
    assert len(done) == 5 and sum(admitted for admitted, _ in replays) == 5
    assert all(admitted == replayed for admitted, replayed in replays), replays


def test_long_prompts_keep_their_own_shape_and_buckets_stop_at_the_cache(cv, prompts, padded, monkeypatch):
    monkeypatch.setattr(runner_module, "PREFILL_BUCKETS", (16, 32))
    eager, _ = run(cv, prompts, Backend(eager=True), True)
    graphed, engine = run(cv, prompts, FakeGraphBackend(), True)
    prefills = engine.prefills
    assert (prefills.padded, prefills.alone) == (3, 2) and sorted(prefills.by_bucket) == [16, 32]  # 39, 97: own
    assert prefills.bucket(32) == 32 and prefills.bucket(33) is None
    for i in (1, 4):  # the prompts prefilled in their own shape: the CPU's very computation
        np.testing.assert_array_equal(graphed[i], eager[i])
    monkeypatch.setattr(runner_module, "PREFILL_BUCKETS", (16, 32, 64, 128, 256, 512))
    small = Engine(cv.ckpt, EngineConfig(max_num_seqs=1, max_positions=100), backend=FakeGraphBackend())
    assert small.prefills.buckets == [16, 32, 64, 100]  # never past the cache's positions
    assert small.prefills.bucket(97) == 100 and small.prefills.bucket(101) is None


def test_the_cpu_and_float32_devices_prefill_each_prompt_in_its_own_shape(cv, prompts, monkeypatch):
    monkeypatch.delenv("OMNITTS_PREFILL_GRAPHS", raising=False)
    for backend in (Backend(eager=True), FakeGraphBackend()):
        _, engine = run(cv, prompts[:2], backend, True)
        assert (engine.prefills.padded, engine.prefills.alone) == (0, 2) and engine.prefills.graphs is None
        assert engine.graph_stats()["prefill_captures"] == 0


def test_a_refused_prefill_capture_warns_once_and_prefills_run_padded_and_eagerly(cv, prompts, padded):
    class Refusing(FakeGraphBackend):
        capture_fallback = True

        def capture(self, fn, pool, restore, output, inputs=None):
            if not restore:  # a call graph's (the prefill's): the frames' graphs restore their small state
                raise RuntimeError("operation not permitted when stream is capturing")
            return super().capture(fn, pool, restore, output, inputs)

    want, _ = run(cv, prompts, FakeGraphBackend(eager=True), True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, engine = run(cv, prompts, Refusing(), True)
    said = [str(w.message) for w in caught if "prefill" in str(w.message)]
    assert len(said) == 1 and "prefill calls run eagerly from here on" in said[0], said
    assert engine.prefills.padded == 5 and engine.prefills.captures == 0
    assert engine.steps and all(steps.captures for steps in engine.steps.values())  # the frames kept theirs
    for i in want:
        np.testing.assert_array_equal(got[i], want[i])


def test_synth_verbose_reports_prefill_graphs_and_eager_gives_the_same_codes(ckpt_dir, tmp_path, padded,
                                                                             monkeypatch):
    from typer.testing import CliRunner

    from omnitts.cli import app
    from omnitts.engine import engine as engine_module

    rows = [{"id": f"l{i}", "text": TEXTS[i % len(TEXTS)], "speaker": "ryan", "max_seconds": 0.4 + 0.16 * i,
             "seed": i, "non_streaming": i == 1} for i in range(4)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    made = []

    def fake(name, eager=False):
        made.append(FakeGraphBackend(eager=eager))
        return made[-1]

    monkeypatch.setattr(engine_module, "get_backend", fake)
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "--dtype", "float32", "--max-batch", "2",
            "--save-codes", "-q", "--verbose", "--no-greedy"]
    out = {}
    for mode in ("--eager", "--no-eager"):
        result = CliRunner().invoke(app, [*args, mode, "-o", str(tmp_path / mode)])
        assert result.exit_code == 0, result.output
        out[mode] = result.output
    assert "prefill graph capture" not in out["--eager"]
    assert "\nprefill graph capture: 2 graphs in " in out["--no-eager"]  # 9 and 39 positions: buckets 16, 64
    for row in rows:
        np.testing.assert_array_equal(np.load(tmp_path / "--no-eager" / f"{row['id']}.codes.npy"),
                                      np.load(tmp_path / "--eager" / f"{row['id']}.codes.npy"), err_msg=row["id"])


def test_in_context_cloning_prompts_go_through_the_padded_graphs_too(tts_factory, ref_wav, padded, monkeypatch):
    """A Base model cloning in context (reference text and codes in the prompt: its longest prompts): graphs
    and eager padded prefills give the same codes, and the prompts did run padded."""
    from omnitts.engine import engine as engine_module

    tts = tts_factory("base", max_batch=2)
    voice = tts.clone_voice(ref_wav, "A short reference line.")
    texts = ["Say it again.", "And once more, a little longer this time."]
    made = []

    def fake(eager_run):
        def make(name, eager=False):
            made.append(FakeGraphBackend(eager=eager_run))
            return made[-1]
        return make

    buckets, bucket = [], runner_module.Prefills.bucket

    def recorded(self, length):
        buckets.append(bucket(self, length))
        return buckets[-1]

    monkeypatch.setattr(runner_module.Prefills, "bucket", recorded)
    codes = {}
    for eager in (True, False):
        monkeypatch.setattr(engine_module, "get_backend", fake(eager))
        tts.release_engine()
        codes[eager] = [a.codes for a in tts.synthesize(texts, voice=voice, greedy=False, seed=3, max_frames=8)]
        tts.release_engine()
    lengths = [tts.prompts.build(Request(t, voice=voice), voice).embeds.shape[0] for t in texts]
    assert min(lengths) > 16  # the reference's codes and text are in every prompt
    assert len(made) == 2 and not made[0].captured and made[1].captured
    assert len(buckets) == 4 and all(b is not None and b >= 32 for b in buckets), buckets  # padded, both runs
    for a, b in zip(codes[True], codes[False]):
        np.testing.assert_array_equal(a, b)
