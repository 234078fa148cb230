"""The batched engine against the one-request slow path, and its scheduling and graph bookkeeping."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from omnitts.device.fake import FakeGraphBackend, GraphRuleError, graph_rules
from omnitts.engine import Engine, EngineConfig
from omnitts.engine.reference import generate_codes
from omnitts.errors import RequestError
from omnitts.request import Request
from omnitts.sampling import FramePlan

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)


def run_engine(tts, jobs, backend=None, **config):
    """jobs: [(Request, SamplingParams)] -> {index: Sequence}; all added up front (admitted as slots free)."""
    engine = Engine(tts.ckpt, EngineConfig(**{"max_positions": 512, **config}), backend=backend)
    seqs = [engine.add(tts.prompts.build(req, _voice(tts, req)), params, tag=i) for i, (req, params) in enumerate(jobs)]
    done = {seq.tag: seq for seq in engine.run()}
    assert len(done) == len(seqs)
    return done


def _voice(tts, req):
    if req.ref_audio is None:
        return None
    return tts.clone_voice(req.ref_audio, req.ref_text, req.x_vector_only)


def slow(tts, req, params):
    return generate_codes(tts.ckpt, tts.prompts.build(req, _voice(tts, req)), params).codes.numpy()


@pytest.fixture(scope="module")
def cv(tts_factory):
    return tts_factory("custom_voice", "tiny-1.7b")


def cv_jobs(tts, greedy=True, n=6, step=4):
    texts = ["Short one.", "A somewhat longer sentence for the batch.", "你好，今天怎么样？",
             "Instructions change the voice.", "Auto language, streaming text.", "Last of the group here."]
    extra = [dict(speaker="ryan", language="english"), dict(speaker="vivian"), dict(speaker="eric", language="chinese"),
             dict(speaker="serena", instruct="Whisper softly."), dict(speaker="aiden", non_streaming=False),
             dict(speaker="dylan", language="auto")]
    return [(Request(texts[i], **extra[i]), tts.default_params(greedy, max_frames=6 + step * i, seed=100 + i))
            for i in range(n)]


def test_batched_greedy_equals_slow_path_with_staggered_admission(cv, tts_factory, ref_wav):
    jobs = cv_jobs(cv)
    done = run_engine(cv, jobs, max_num_seqs=3)  # 6 requests through 3 slots: admissions mid-run
    for i, (req, params) in enumerate(jobs):
        np.testing.assert_array_equal(done[i].codes(), slow(cv, req, params), err_msg=f"request {i}")
    assert max(seq.admitted_at for seq in done.values()) > 0
    base = tts_factory("base")
    clone_jobs = [
        (Request("Cloned, in context.", ref_audio=ref_wav, ref_text="Reference words."), base.default_params(True, max_frames=9)),
        (Request("Cloned, x-vector only.", ref_audio=ref_wav, x_vector_only=True), base.default_params(True, max_frames=5)),
        (Request("In context, non-streaming.", ref_audio=ref_wav, ref_text="Ref.", non_streaming=True),
         base.default_params(True, max_frames=7)),
    ]
    done = run_engine(base, clone_jobs, max_num_seqs=2)
    for i, (req, params) in enumerate(clone_jobs):
        np.testing.assert_array_equal(done[i].codes(), slow(base, req, params), err_msg=f"clone request {i}")


def test_seeded_sampling_is_batch_invariant_and_matches_slow_path(cv):
    target = (Request("The request we watch.", speaker="ryan"), cv.default_params(False, max_frames=12, seed=7))
    alone = run_engine(cv, [target], max_num_seqs=1)[0].codes()
    crowd = [(Request(f"Other request {i}.", speaker="vivian"), cv.default_params(False, max_frames=5 + i, seed=i))
             for i in range(16)]
    together = run_engine(cv, crowd[:9] + [target] + crowd[9:], max_num_seqs=17)[9].codes()
    np.testing.assert_array_equal(alone, together)
    np.testing.assert_array_equal(alone, slow(cv, *target))
    assert not np.array_equal(alone, run_engine(cv, [(target[0], cv.default_params(False, max_frames=12, seed=8))],
                                                max_num_seqs=1)[0].codes())


def test_batches_mixing_sampling_plans_match_each_request_alone(cv):
    """Greedy, top-k 50, top-k off and top-p rows share batches whose plan (K, top-p on/off) changes as
    requests come and go: each request's codes still equal its one-request run (its own plan),
    eagerly and under fake graphs, which are captured per plan."""
    jobs = [(Request("Greedy in a sampled batch.", speaker="ryan"), cv.default_params(True, max_frames=6)),
            (Request("Top-k fifty.", speaker="vivian"), cv.default_params(False, max_frames=9, seed=3)),
            (Request("Top-k off in the talker.", speaker="ryan"),
             cv.default_params(False, max_frames=4, seed=4, top_k=0, subtalker_top_p=0.8)),
            (Request("Nucleus and a wide sub-talker top-k.", speaker="eric"),
             cv.default_params(False, max_frames=7, seed=5, top_p=0.9, subtalker_top_k=200))]
    backend = FakeGraphBackend()
    alone = [slow(cv, req, params) for req, params in jobs]
    for done in (run_engine(cv, jobs, max_num_seqs=2), run_engine(cv, jobs, backend=backend, max_num_seqs=2)):
        for i, codes in enumerate(alone):
            np.testing.assert_array_equal(done[i].codes(), codes, err_msg=f"request {i}")
    # A graph per (plan, batch bucket, span bucket) a frame needed, and only those: each replayed.
    assert len(backend.captured) >= 3 and all(graph.replays for graph in backend.captured)


def test_fake_graph_path_equals_eager(cv):
    for greedy in (True, False):
        jobs = cv_jobs(cv, greedy=greedy, step=2)  # budgets 6..16: batches of 4, 3, 2 and 1 all still run
        eager = run_engine(cv, jobs, max_num_seqs=4)
        backend = FakeGraphBackend()
        graphed = run_engine(cv, jobs, backend=backend, max_num_seqs=4)
        # Batch buckets 1, 2, 4 (spans all < 256) captured when first needed; span 512 never is.
        assert len(backend.captured) == 3 and all(g.replays > 0 for g in backend.captured)
        for i in eager:
            np.testing.assert_array_equal(eager[i].codes(), graphed[i].codes(), err_msg=f"request {i}")


def test_frame_step_makes_no_host_sync_and_the_check_can_fail(cv):
    engine = Engine(cv.ckpt, EngineConfig(max_num_seqs=2, max_positions=256))
    engine.add(cv.prompts.build(Request("Check syncs.", speaker="ryan")), cv.default_params(False, max_frames=3, seed=1))
    engine._admit()
    plan = FramePlan.of([seq.params for seq in engine.scheduler.running], *engine.vocabs)
    assert plan.talker.samples and plan.predictor.samples
    # One eager frame first, as a capture's warm-up runs: it makes the constants (`sampling._c`). Without it the
    # test passed only after some earlier test in its process had made them, and failed alone.
    engine.runner.frame(1, 64, plan)
    with graph_rules():
        engine.runner.frame(1, 64, plan)  # the whole frame: noise, sampling, predictor loop, talker step
    with pytest.raises(GraphRuleError, match="host sync `item`"):
        with graph_rules():
            engine.state.codes.sum().item()
    with pytest.raises(GraphRuleError, match="random number generation"):
        with graph_rules():
            engine.state.logits.exponential_()


def test_finished_requests_waste_at_most_one_frame_and_free_their_slot(tts_factory):
    tts = tts_factory("custom_voice", eos_scale=3.0)  # early EOS is common here
    jobs = [(Request("Long runner keeps going.", speaker="ryan"), tts.default_params(True, max_frames=40))]
    jobs += [(Request(f"Short {i}.", speaker="vivian"), tts.default_params(True, max_frames=3)) for i in range(4)]
    done = run_engine(tts, jobs, max_num_seqs=2)
    long_end = done[0].finished_at
    assert any(seq.admitted_at < long_end for i, seq in done.items() if i >= 2), "a freed slot was not reused"
    reasons = set()
    for seq in done.values():
        reasons.add(seq.finish_reason)
        useful = len(seq.frames) + (seq.finish_reason == "eos")
        assert seq.launched - useful <= 1, (seq.launched, useful)
    assert reasons == {"eos", "length"}
    for i, (req, params) in enumerate(jobs):
        np.testing.assert_array_equal(done[i].codes(), slow(tts, req, params))


def test_request_that_cannot_fit_is_refused(cv):
    engine = Engine(cv.ckpt, EngineConfig(max_num_seqs=1, max_positions=32))
    with pytest.raises(RequestError, match="exceeds the engine's max_positions=32"):
        engine.add(cv.prompts.build(Request("Too long for this cache.", speaker="ryan")), cv.default_params(True, max_frames=30))


def test_api_batches_a_list_and_matches_the_reference_path(cv):
    texts = ["First of three.", "The second is a little longer than the first.", "Third."]
    results = cv.synthesize(texts, speaker="ryan", language="english", greedy=True, max_frames=7)
    assert [r.id for r in results] == ["0", "1", "2"]
    for text, result in zip(texts, results):
        reference = cv.run_reference(Request(text, "english", "ryan"), cv.default_params(True, max_frames=7))
        np.testing.assert_array_equal(result.codes, reference.codes)
        np.testing.assert_allclose(result.audio, reference.audio, atol=1e-5)


def test_unavailable_devices_fail_with_one_clear_line(ckpt_dir, tmp_path):
    from typer.testing import CliRunner

    from omnitts.cli import app

    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"id": "a", "text": "Hi.", "speaker": "ryan"}\n')
    cases = [("npu", "--device npu needs torch_npu and the Ascend CANN toolkit"), ("tpu", "choose cpu, cuda or npu")]
    if not torch.cuda.is_available():  # where a GPU is visible, --device cuda is not an error
        cases.append(("cuda", "no CUDA device is visible"))
    for device, needle in cases:
        result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")),
                                          "-o", str(tmp_path / "o"), "--device", device, "-q"])
        assert result.exit_code == 2 and needle in result.output, (device, result.output)


def test_graph_buckets_are_configurable(cv):
    jobs = cv_jobs(cv, greedy=True)
    backend = FakeGraphBackend()
    graphed = run_engine(cv, jobs, backend=backend, max_num_seqs=4, graph_buckets=(3, 8))
    # Batch buckets 3 and 4 (max_num_seqs; 8 is beyond it), each needed, at span 256 (frames never reach 512);
    # the default buckets would capture 1, 2 and 4.
    assert len(backend.captured) == 2 and all(graph.replays for graph in backend.captured)
    eager = run_engine(cv, jobs, max_num_seqs=4)
    for i in eager:
        np.testing.assert_array_equal(eager[i].codes(), graphed[i].codes(), err_msg=f"request {i}")
    with pytest.raises(ValueError, match="graph_buckets"):
        EngineConfig(graph_buckets=(0, 2))


def test_compaction_copies_only_the_positions_a_moved_row_has(cv, monkeypatch):
    """A finished request's slot takes the last running one: its K/V are copied up to its length (the frame
    in flight included), not the slot's whole capacity, and every request still equals its slow path."""
    from omnitts.engine.state import SlotCache

    moves, real = [], SlotCache.move_row

    def move_row(self, src, dst, length):
        moves.append((length, self.capacity, self.k[0][src, :, length:].abs().sum().item()))
        real(self, src, dst, length)

    monkeypatch.setattr(SlotCache, "move_row", move_row)
    jobs = cv_jobs(cv, n=4)
    jobs = [(req, replace(params, max_frames=frames)) for (req, params), frames in zip(jobs, (4, 14, 6, 20))]
    done = run_engine(cv, jobs, max_num_seqs=4, max_positions=256)
    assert moves, "no compaction happened"
    for length, capacity, beyond in moves:
        # Four requests in four fresh slots: a moved row has nothing written past the length copied.
        assert 0 < length < capacity and beyond == 0, (length, capacity, beyond)
    for i, (req, params) in enumerate(jobs):
        np.testing.assert_array_equal(done[i].codes(), slow(cv, req, params), err_msg=f"request {i}")


def test_eager_and_omnitts_eager_rule_graph_capture_out(cv, monkeypatch):
    """`--eager` (the backend's `eager`) and OMNITTS_EAGER=1 run every frame eagerly: nothing is captured."""
    jobs = cv_jobs(cv, n=2)
    graphed = FakeGraphBackend()
    run_engine(cv, jobs, backend=graphed, max_num_seqs=2)
    assert graphed.captured  # the same run without the switches captures
    flag = FakeGraphBackend(eager=True)
    run_engine(cv, jobs, backend=flag, max_num_seqs=2)
    monkeypatch.setenv("OMNITTS_EAGER", "1")
    env = FakeGraphBackend()
    run_engine(cv, jobs, backend=env, max_num_seqs=2)
    assert flag.captured == [] and env.captured == []


def test_no_frame_runs_when_every_running_request_has_launched_its_whole_budget(cv):
    """With deferred copies the host learns of EOS one step late, but a frame budget it knows: a request
    alone, or a batch whose last requests have launched every frame they may keep, runs no overshoot frame."""
    jobs = cv_jobs(cv, n=3, step=3)  # budgets 6, 9, 12
    done = run_engine(cv, jobs, max_num_seqs=4)
    for i, (req, params) in enumerate(jobs):
        np.testing.assert_array_equal(done[i].codes(), slow(cv, req, params), err_msg=f"request {i}")
    assert done[2].launched == 12  # the longest ran last, alone: no frame beyond its budget
    alone = run_engine(cv, [jobs[0]], max_num_seqs=1)[0]
    assert alone.launched == len(alone.frames) == 6


def test_the_accelerators_decode_attention_gives_the_same_codes_under_fake_graphs(cv, monkeypatch):
    """The talker decode attention accelerators use (`layers.grouped_decode_attention`, no enable_gqa) in the
    batched engine under the CPU fake's graphs: codes equal each request's one-by-one reference run."""
    from omnitts.models import layers

    jobs = cv_jobs(cv, greedy=True, n=4)
    alone = [slow(cv, req, params) for req, params in jobs]
    stack = cv.ckpt.model.talker.model
    monkeypatch.setattr(stack, "attend", layers.grouped_decode_attention)
    done = run_engine(cv, jobs, backend=FakeGraphBackend(), max_num_seqs=4)
    for i, codes in enumerate(alone):
        np.testing.assert_array_equal(done[i].codes(), codes, err_msg=f"request {i}")
