"""The code predictor's preallocated frame caches (fixed-shape: the NPU path; prefix: CPU and CUDA)
against the growing cache of the slow path.

The fixed-shape variant attends over all G positions under a mask, in pure torch (sdpa) and through
`torch_npu.npu_fusion_attention`; the NPU call runs here against a stub torch_npu that checks the
argument contract and computes with sdpa, so the call site is exercised on the CPU.
"""

from __future__ import annotations

import importlib.abc
import sys
import types

import numpy as np
import pytest
import torch

from omnitts.device import get_backend
from omnitts.device.fake import FakeGraphBackend
from omnitts.device.npu import FusionAttention, torch_npu_mismatch
from omnitts.engine import Engine, EngineConfig
from omnitts.engine.reference import predict_residuals, predictor_cache, predictor_frame_cache
from omnitts.errors import OmniTTSError
from omnitts.models.kv_cache import FrameKVCache, StaticKVCache
from omnitts.models.layers import sdpa_attention
from omnitts.params import RowParams, SamplingParams
from omnitts.request import Request
from omnitts.sampling import Plan

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

HIDDEN_TOLERANCE = 1e-5  # float32: a masked sum over 16 slots vs a sum over the filled ones


def traced_predictor(talker, monkeypatch, **kwargs):
    """Run one frame's predictor loop for 5 random rows; return (codes, [hidden per step])."""
    predictor = talker.code_predictor
    hiddens = []
    logits = predictor.logits
    def traced(group, hidden):
        hiddens.append(hidden.clone())
        return logits(group, hidden)

    monkeypatch.setattr(predictor, "logits", traced)
    gen = torch.Generator().manual_seed(0)
    batch = 5
    past = torch.randn((batch, talker.cfg.hidden_size), generator=gen)
    c0 = torch.randint(0, 2048, (batch,), generator=gen)
    rows = RowParams.of([SamplingParams().greedy()] * batch, torch.device("cpu"))
    with torch.inference_mode():
        codes = predict_residuals(talker, past, c0, rows, None, Plan(), **kwargs)
    monkeypatch.undo()
    return codes, hiddens


@pytest.mark.parametrize("preset", ["tiny-0.6b", "tiny-1.7b"])
def test_fixed_shape_predictor_equals_growing_cache(tts_factory, monkeypatch, preset):
    talker = tts_factory("custom_voice", preset).ckpt.model.talker
    codes, hiddens = traced_predictor(talker, monkeypatch)
    static = predictor_cache(talker, rows=8)
    assert static.capacity == talker.code_predictor.cfg.num_code_groups
    for _ in range(2):  # a second frame reuses the buffers: nothing may leak from the first
        fixed_codes, fixed_hiddens = traced_predictor(talker, monkeypatch, frame_cache=static)
        torch.testing.assert_close(fixed_codes, codes, rtol=0, atol=0)
        assert len(fixed_hiddens) == len(hiddens) == talker.code_predictor.cfg.num_code_groups - 1
        worst = max((a[:, -1] - b[:, -1]).abs().max().item() for a, b in zip(fixed_hiddens, hiddens))
        assert worst < HIDDEN_TOLERANCE, worst
    assert static.length == static.capacity  # the frame filled every slot


def test_static_cache_mask_hides_unwritten_slots_and_stays_causal():
    cache = StaticKVCache(layers=1, rows=2, kv_heads=1, capacity=4, head_dim=2, dtype=torch.float32, device="cpu")
    cache.k[0].fill_(float("nan"))  # stale garbage must be cleared by start()
    cache.start(2)
    assert not cache.k[0][:2].isnan().any()
    np.testing.assert_array_equal(cache.mask(2)[0, 0].numpy(), [[1, 0, 0, 0], [1, 1, 0, 0]])
    keys, _ = cache.update(0, torch.ones((2, 1, 2, 2)), torch.ones((2, 1, 2, 2)))
    assert keys.shape == (2, 1, 4, 2) and cache.length == 2
    np.testing.assert_array_equal(cache.mask(1)[0, 0].numpy(), [[1, 1, 1, 0]])
    cache.update(0, torch.ones((2, 1, 2, 2)), torch.ones((2, 1, 2, 2)))
    with pytest.raises(AssertionError, match="capacity 4"):
        cache.update(0, torch.ones((2, 1, 1, 2)), torch.ones((2, 1, 1, 2)))


def engine_codes(tts, backend=None, greedy=True):
    """4 requests through 4 slots (graph buckets 1, 2, 4 all serve some step) -> [codes per request]."""
    texts = ["Short one.", "A somewhat longer sentence for the batch.", "你好，今天怎么样？", "Last of the group."]
    engine = Engine(tts.ckpt, EngineConfig(max_num_seqs=4, max_positions=256), backend=backend)
    for i, text in enumerate(texts):
        engine.add(tts.prompts.build(Request(text, speaker="ryan")),
                   tts.default_params(greedy, max_frames=3 + 3 * i, seed=10 + i), tag=i)
    done = {seq.tag: seq.codes() for seq in engine.run()}
    return [done[i] for i in range(len(texts))]


@pytest.fixture(scope="module")
def cv(tts_factory):
    return tts_factory("custom_voice", "tiny-1.7b")


def test_engine_with_fixed_shape_predictor_matches_today_eager_and_under_fake_graphs(cv):
    today = engine_codes(cv)
    eager = engine_codes(cv, FakeGraphBackend(eager=True, predictor_attention=sdpa_attention))
    graphed_backend = FakeGraphBackend(predictor_attention=sdpa_attention)
    graphed = engine_codes(cv, graphed_backend)
    assert len(graphed_backend.captured) == 3 and all(g.replays > 0 for g in graphed_backend.captured)
    for i, codes in enumerate(today):
        np.testing.assert_array_equal(eager[i], codes, err_msg=f"eager, request {i}")
        np.testing.assert_array_equal(graphed[i], codes, err_msg=f"graphed, request {i}")


class StubTorchNpu(types.ModuleType):
    """`torch_npu` with only `npu_fusion_attention`: checks our call against the documented contract
    (see FusionAttention) and computes it with sdpa; records every call's shapes."""

    def __init__(self):
        super().__init__("torch_npu")
        self.calls = []

    def npu_fusion_attention(self, query, key, value, head_num, input_layout, *, pse=None, padding_mask=None,
                             atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=2147483647,
                             next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
                             actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False):
        assert input_layout == "BNSD" and query.dim() == key.dim() == value.dim() == 4
        assert head_num == query.shape[1] and head_num % key.shape[1] == 0 and key.shape == value.shape
        assert atten_mask is not None and atten_mask.dtype == torch.bool
        sq, skv = query.shape[2], key.shape[2]
        assert atten_mask.shape in {(sq, skv), (1, 1, sq, skv), (query.shape[0], 1, sq, skv)}, atten_mask.shape
        assert sparse_mode == 0 and actual_seq_qlen is None and actual_seq_kvlen is None and keep_prob == 1.0
        assert scale == pytest.approx(query.shape[-1] ** -0.5)
        self.calls.append((tuple(query.shape), tuple(key.shape), tuple(atten_mask.shape)))
        out = sdpa_attention(query, key, value, ~atten_mask, False)  # True = masked, inverted; default scale
        stats = torch.zeros((query.shape[0], head_num, sq, 8))
        return out, stats, stats.clone(), torch.empty(0), 0, 0, 0


@pytest.fixture
def stub_npu(monkeypatch):
    stub = StubTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", stub)
    return stub


def test_npu_kernel_call_site_under_fake_graphs_with_a_stub_torch_npu(cv, stub_npu):
    backend = FakeGraphBackend(predictor_attention=FusionAttention())
    codes = engine_codes(cv, backend)
    for i, expected in enumerate(engine_codes(cv)):
        np.testing.assert_array_equal(codes[i], expected, err_msg=f"request {i}")
    cfg = cv.ckpt.config.predictor
    assert stub_npu.calls
    # Fixed shapes: every call attends over all G slots; only the query length (prefill 2, steps 1) varies.
    assert {k[2] for _, k, _ in stub_npu.calls} == {cfg.num_code_groups}
    assert {m for _, _, m in stub_npu.calls} == {(1, 1, 2, cfg.num_code_groups), (1, 1, 1, cfg.num_code_groups)}
    assert {q[1] for q, _, _ in stub_npu.calls} == {cfg.num_attention_heads}
    assert {k[1] for _, k, _ in stub_npu.calls} == {cfg.num_key_value_heads}


def test_npu_backend_selects_the_fused_kernel_and_cpu_keeps_todays_path(cv, stub_npu, monkeypatch):
    monkeypatch.setattr(torch, "npu", _npu_namespace("Ascend910B3"), raising=False)
    backend = get_backend("npu", eager=True)
    attend = backend.predictor_attention()
    assert isinstance(attend, FusionAttention) and attend.op == stub_npu.npu_fusion_attention
    engine = Engine(cv.ckpt, EngineConfig(max_num_seqs=2, max_positions=64), backend=backend)
    chosen = engine.runner.predictor_cache.attend
    assert isinstance(chosen, FusionAttention) and chosen.op == stub_npu.npu_fusion_attention
    cpu = Engine(cv.ckpt, EngineConfig(max_num_seqs=2, max_positions=64)).runner.predictor_cache
    assert isinstance(cpu, FrameKVCache) and cpu.attend is None  # preallocated, torch's kernel


def _npu_namespace(soc: str):
    """What torch_npu registers as torch.npu, as far as the backend asks."""
    return types.SimpleNamespace(is_available=lambda: True, current_device=lambda: 0, get_device_name=lambda index: soc)


@pytest.mark.parametrize("soc,fused,dtype", [("Ascend910B3", True, "bfloat16"), ("Ascend910_9392", True, "bfloat16"),
                                              ("Ascend950PR", True, "bfloat16"), ("Ascend310P3", False, "float16"),
                                              ("Ascend910A", False, "float16"), ("", False, "float16")])
def test_npu_parts_without_the_fused_kernel_get_sdpa_and_float16(stub_npu, monkeypatch, soc, fused, dtype):
    """`npu_fusion_attention` and bfloat16 are documented for Atlas A2-class parts: elsewhere `auto` means
    float16 and the code predictor attends with torch's sdpa, with a warning naming the part."""
    from omnitts.device.features import resolve_dtype

    monkeypatch.setattr(torch, "npu", _npu_namespace(soc), raising=False)
    assert resolve_dtype("auto", "npu") == dtype and resolve_dtype("float32", "npu") == "float32"
    backend = get_backend("npu", eager=True)
    if fused:
        assert isinstance(backend.predictor_attention(), FusionAttention)
    else:
        with pytest.warns(RuntimeWarning, match=f"this one is {soc or 'unknown'}, so the code predictor attends"):
            assert backend.predictor_attention() is None


@pytest.mark.parametrize("preset", ["tiny-0.6b", "tiny-1.7b"])
def test_preallocated_frame_cache_equals_growing_cache_exactly(tts_factory, monkeypatch, preset):
    """The CPU/CUDA engines' frame cache: the same keys attended in the same order, so bitwise the
    growing cache's codes and hidden states, frame after frame in the same buffers."""
    talker = tts_factory("custom_voice", preset).ckpt.model.talker
    codes, hiddens = traced_predictor(talker, monkeypatch)
    cache = predictor_frame_cache(talker, rows=8)
    for _ in range(2):
        again, again_hiddens = traced_predictor(talker, monkeypatch, frame_cache=cache)
        assert torch.equal(again, codes)
        assert all(torch.equal(a, b) for a, b in zip(again_hiddens, hiddens))
        assert cache.length == cache.capacity  # [hidden, c0] then c1..c14: every slot, c15 never fed back


class _ImportRecorder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.asked = []

    def find_spec(self, name, path=None, target=None):
        self.asked.append(name)
        return None  # let the normal finders answer


def test_torch_npu_is_imported_only_when_npu_is_chosen(cv, monkeypatch):
    assert "torch_npu" not in sys.modules
    recorder = _ImportRecorder()
    monkeypatch.setattr(sys, "meta_path", [recorder, *sys.meta_path])
    get_backend("cpu")
    Engine(cv.ckpt, EngineConfig(max_num_seqs=2, max_positions=64))
    assert "torch_npu" not in recorder.asked
    with pytest.raises(OmniTTSError, match="--device npu needs torch_npu"):
        get_backend("npu")
    assert "torch_npu" in recorder.asked


@pytest.mark.parametrize("torch_version, npu_version, ok", [
    ("2.14.0", "2.14.0", True), ("2.14.1+cpu", "2.14.0", True), ("2.12.0", "2.12.0.post3", True),
    ("2.11.0+cpu", "2.11.0.post3", True), ("2.13.0+cpu", "2.14.0", False), ("2.14.0", "2.13.0", False),
])
def test_torch_npu_pairs_are_matched_by_release_line(torch_version, npu_version, ok):
    problem = torch_npu_mismatch(torch_version, npu_version)
    assert (problem is None) == ok
    if not ok:
        line = ".".join(torch_version.split(".")[:2])
        assert npu_version in problem and torch_version in problem and f'"torch=={line}.*"' in problem


def test_a_mismatched_torch_npu_is_named_before_it_is_imported(monkeypatch):
    """A torch_npu built for another torch fails inside its own import with errors that do not say why:
    the backend compares the installed releases first and never imports the wrong one."""
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "2.99.0" if name == "torch_npu" else real(name))
    recorder = _ImportRecorder()
    monkeypatch.setattr(sys, "meta_path", [recorder, *sys.meta_path])
    with pytest.raises(OmniTTSError, match=r"torch_npu 2\.99\.0 is built for torch 2\.99, but torch is "):
        get_backend("npu")
    assert "torch_npu" not in recorder.asked


class _RefusingBackend(FakeGraphBackend):
    """A device whose graph capture fails, as CANN < 8.1 (no aclmdlRICaptureBegin) or a stream shortage does."""

    capture_fallback = True

    def capture(self, fn, pool, restore, output, inputs=None):
        self.attempts = getattr(self, "attempts", 0) + 1
        raise RuntimeError("aclmdlRICaptureBegin: capture is not supported by this CANN")


def test_a_refused_capture_runs_eager_frames_with_one_warning(cv):
    """Capture failure of any kind falls back to eager frames, warning once, with the codes eager gives;
    later sampling plans do not try again."""
    eager = engine_codes(cv, FakeGraphBackend(eager=True), greedy=False)
    backend = _RefusingBackend()
    with pytest.warns(RuntimeWarning, match="graph capture failed .*frames run eagerly") as caught:
        codes = engine_codes(cv, backend, greedy=False) + engine_codes(cv, backend, greedy=True)
    assert len([w for w in caught if "graph capture failed" in str(w.message)]) == 1
    assert backend.attempts == 1 and backend.eager and not backend.captured
    assert all(np.array_equal(a, b) for a, b in zip(codes[:4], eager))
    assert all(np.array_equal(a, b) for a, b in zip(codes[4:], engine_codes(cv, FakeGraphBackend(eager=True))))


class _SyncingRunner:
    """A frame that reads a value back to the host: a graph cannot record that."""

    def __init__(self, tensor):
        self.tensor = tensor

    def frame(self, batch, span):
        if self.tensor.sum().item() > 1e9:
            self.tensor.zero_()


def test_the_fake_raises_its_graph_rules_instead_of_falling_back():
    from omnitts.device.fake import GraphRuleError

    state = [torch.zeros(2)]
    with pytest.raises(GraphRuleError):
        FakeGraphBackend().frame_steps(_SyncingRunner(state[0]), 1, 8, state, state[0], [1], [8]).run(1, 8)


def test_task_queue_level_2_turns_npu_graphs_off_with_a_warning(monkeypatch):
    """TASK_QUEUE_ENABLE=2 (exported by many Ascend guides) makes NPU graph capture fail: the backend says
    so and runs eager frames; the Ascend recipe sets level 1."""
    from omnitts.device import npu

    monkeypatch.setattr(npu, "import_torch_npu", lambda: None)
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "2")
    with pytest.warns(RuntimeWarning, match="TASK_QUEUE_ENABLE=2 makes NPU graph capture fail"):
        assert npu.NpuBackend().eager
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "1")  # what recipes/ascend-910b.toml sets (tests/test_recipe.py)
    assert not npu.NpuBackend().eager
