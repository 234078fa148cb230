"""Graph bookkeeping on the CPU fake: (batch, span) buckets, the fake's graph rules, one replay per
step without host syncs, and the per-step prefill budget."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch

from omnitts import sampling
from omnitts.device.base import frame_kv_bytes
from omnitts.device.fake import FakeGraphBackend, GraphRuleError, graph_rules, no_host_sync
from omnitts.engine import Engine, EngineConfig
from omnitts.request import Request

TEXTS = ["Short one.", "A somewhat longer sentence for the batch.", "你好，今天怎么样？", "Last of the group here."]


@pytest.fixture(scope="module")
def cv(tts_factory):
    return tts_factory("custom_voice")


def prompts(tts, n=4):
    return [tts.prompts.build(Request(TEXTS[i % len(TEXTS)], speaker="ryan")) for i in range(n)]


def drive(engine, tts, greedy, frames, on_step=None):
    """Add one request per frame budget, step to the end; returns ({tag: codes}, spans run)."""
    for i, (prompt, max_frames) in enumerate(zip(prompts(tts, len(frames)), frames)):
        engine.add(prompt, tts.default_params(greedy, max_frames=max_frames, seed=20 + i), tag=i)
    spans, make = [], engine._steps

    def recording(plan):  # the frame steps of every plan log the (batch, span) they are asked for
        steps = make(plan)
        if not getattr(steps, "recording", False):
            run, steps.recording = steps.run, True
            steps.run = lambda batch, span: (spans.append((batch, span)), run(batch, span))[1]
        return steps

    engine._steps = recording
    done = {}
    while engine.has_work():
        if on_step:
            on_step(engine)
        done.update({seq.tag: seq.codes() for seq in engine.step()})
    return done, spans


@pytest.mark.parametrize("greedy", [True, False])
def test_graphs_equal_eager_in_every_batch_and_span_bucket(cv, greedy):
    frames = [3, 7, 12, 18]  # batch shrinks 4 -> 3 -> 2 -> 1 while the spans grow
    positions = max(p.embeds.shape[0] for p in prompts(cv)) + max(frames) + 2
    eager, spans = drive(Engine(cv.ckpt, EngineConfig(max_num_seqs=4, max_positions=positions)), cv, greedy, frames)
    seen = sorted({span for _, span in spans})
    span_buckets = (seen[len(seen) // 3], seen[2 * len(seen) // 3])  # requests cross both boundaries
    backend = FakeGraphBackend()
    engine = Engine(cv.ckpt, EngineConfig(max_num_seqs=4, max_positions=positions, span_buckets=span_buckets),
                    backend=backend)
    steps = engine.steps_for([cv.default_params(greedy, max_frames=1, seed=20)])  # the plan these requests share
    assert steps.sizes == [1, 2, 4] and steps.spans == [*span_buckets, positions]
    assert not steps.graphs and not backend.captured  # nothing is captured before a frame needs it
    graphed, spans = drive(engine, cv, greedy, frames)
    needed = {steps.bucket(batch, span) for batch, span in spans}
    assert set(steps.graphs) == needed and len(backend.captured) == len(needed)  # no other plan, no unused graph
    assert all(graph.replays for graph in backend.captured)
    assert {size for size, _ in needed} == {1, 2, 4} and {span for _, span in needed} == set(steps.spans)
    assert steps.captures == len(needed) and steps.warmup_frames == len(needed)  # one warm-up frame per graph
    for i in eager:
        np.testing.assert_array_equal(graphed[i], eager[i], err_msg=f"request {i}")


def test_a_short_batch_reads_a_sixteenth_of_the_kv_of_a_full_one(cv):
    engine = Engine(cv.ckpt, EngineConfig(max_num_seqs=2, max_positions=4096), backend=FakeGraphBackend())
    steps = engine.steps_for([cv.default_params(True, max_frames=1)])
    assert steps.spans == [256, 512, 1024, 2048, 4096] and steps.sizes == [1, 2]
    assert steps.bucket(2, 100) == (2, 256) and steps.bucket(1, 257) == (1, 512) and steps.bucket(2, 4096) == (2, 4096)
    read = []
    update = engine.cache.update

    def counted(layer, k, v):  # the K/V views attention actually receives
        keys, values = update(layer, k, v)
        read.append(keys.numel() * keys.element_size() + values.numel() * values.element_size())
        return keys, values

    engine.cache.update = counted
    measured = {}
    for span in (100, 4096):
        steps.run(2, span)  # the first run of a bucket captures it (a warm-up frame, the capture, the replay)
        read.clear()
        steps.run(2, span)
        measured[span] = sum(read)
        assert measured[span] == frame_kv_bytes(engine.cache, *steps.bucket(2, span))
    assert measured[100] * 8 <= measured[4096] and measured[100] * 16 == measured[4096]


def capture(backend, fn, state):
    return backend.capture(fn, backend.graph_pool(), state, state[-1])


def test_the_fake_catches_host_data_and_python_values_that_change_between_replays():
    backend = FakeGraphBackend()
    state = [torch.zeros(4), torch.zeros(2, dtype=torch.long)]
    good = capture(backend, lambda: state[0].add_(torch.full((4,), 2.0)), state)
    for _ in range(3):
        good.replay()
    assert good.replays == 3 and state[0].tolist() == [6.0] * 4
    for bad, what in [(lambda: state[0].add_(torch.tensor([1.0, 2.0, 3.0, 4.0])), "tensor from host data"),
                      (lambda: state[0].add_(torch.as_tensor(np.ones(4))), "tensor from host data"),
                      (lambda: state[0].add_(state[0].new_tensor([1.0])), "tensor from host data"),
                      (lambda: state[0].add_(torch.from_numpy(np.ones(4, dtype=np.float32))), "tensor from host data")]:
        with pytest.raises(GraphRuleError, match=what):
            capture(backend, bad, state)
    counter = iter(range(100))  # a Python int that grows: a real graph would replay the captured one
    drifting = capture(backend, lambda: state[0].add_(next(counter)), state)
    with pytest.raises(GraphRuleError, match="differs from the capture .*add_"):
        drifting.replay()
    shapes = iter(range(1, 100))  # a host-side length: the shape would be baked in
    resized = capture(backend, lambda: state[0][: next(shapes) % 4].mul_(2), state)
    with pytest.raises(GraphRuleError, match="differs from the capture"):
        resized.replay()


def test_one_replay_per_step_and_no_host_sync_outside_collect(cv):
    backend = FakeGraphBackend()
    engine = Engine(cv.ckpt, EngineConfig(max_num_seqs=3, max_positions=256), backend=backend)
    steps = engine.steps_for([cv.default_params(True, max_frames=1)])
    for size in steps.sizes:  # capture the greedy plan's graphs up front (a frame would capture its own bucket)
        steps.run(size, 1)
    assert len(backend.captured) == 3 and all(len(graph.trace) > 100 for graph in backend.captured)  # the real frame
    frame = engine.runner.frame

    def only_in_graphs(*args):
        assert any(graph.active for graph in backend.captured), "runner.frame ran eagerly in graph mode"
        return frame(*args)

    engine.runner.frame = only_in_graphs
    real_numpy, collect = torch.Tensor.numpy, engine._collect

    def waiting_collect(pending):  # the one place the host may wait for the device
        with mock.patch.object(torch.Tensor, "numpy", real_numpy):
            return collect(pending)

    engine._collect = waiting_collect
    replays_per_step = []

    def total():
        return sum(graph.replays for graph in backend.captured)

    def step_checked(engine, step=engine.step):
        # A frame runs while some request has budget left to launch (none runs just to collect the last copy).
        budget_left = any(seq.launched < seq.params.max_frames for seq in engine.scheduler.running)
        before, running = total(), bool(budget_left or engine.scheduler.waiting)
        with no_host_sync():
            finished = step()
        replays_per_step.append((running, total() - before))
        return finished

    engine.step = lambda: step_checked(engine)
    done, _ = drive(engine, cv, True, [2, 5, 3, 6, 4])  # 5 requests through 3 slots: admissions mid-run
    assert len(done) == 5 and len(replays_per_step) > 6
    assert all(count == (1 if running else 0) for running, count in replays_per_step), replays_per_step
    with pytest.raises(GraphRuleError, match="host sync"), no_host_sync():
        engine.state.lengths.max().item()


def test_the_eager_frame_obeys_graph_rules_at_several_batch_sizes(cv):
    engine = Engine(cv.ckpt, EngineConfig(max_num_seqs=3, max_positions=256))
    for i, prompt in enumerate(prompts(cv, 3)):
        engine.add(prompt, cv.default_params(i % 2 == 0, max_frames=4, seed=i))
    engine._admit()
    for batch in (1, 2, 3):
        running = engine.scheduler.running[:batch]
        span = max(engine.cache_lengths(running)) + 1
        plan = sampling.FramePlan.of([seq.params for seq in running], *engine.vocabs)
        engine.runner.frame(batch, span, plan)  # eager first, as a capture's warm-up: it makes sampling's constants
        with graph_rules():
            engine.runner.frame(batch, span, plan)
    with pytest.raises(GraphRuleError, match="tensor from host data"), graph_rules():
        torch.tensor([1, 2])


def test_a_burst_of_admissions_is_spread_over_steps_with_the_same_codes(cv):
    frames = [6, 4, 8, 5, 7, 3]
    lengths = [p.embeds.shape[0] for p in prompts(cv, len(frames))]
    budget = max(lengths) + min(lengths) - 1  # never room for the two longest together

    def run(limit):
        engine = Engine(cv.ckpt, EngineConfig(max_num_seqs=6, max_positions=256, max_prefill_tokens=limit))
        seqs = []
        engine.add = (lambda add: lambda *a, **k: seqs.append(add(*a, **k)) or seqs[-1])(engine.add)
        done, _ = drive(engine, cv, True, frames)
        return done, [seq.admitted_at for seq in sorted(seqs, key=lambda s: s.id)]

    unlimited, at_once = run(None)
    spread, admitted_at = run(budget)
    assert at_once == [0] * 6
    assert admitted_at == sorted(admitted_at) and len(set(admitted_at)) >= 3, admitted_at  # in order, over steps
    for step in set(admitted_at):
        batch = [n for n, at in zip(lengths, admitted_at) if at == step]
        assert len(batch) == 1 or sum(batch) <= budget, (step, batch)
    for i in unlimited:
        np.testing.assert_array_equal(spread[i], unlimited[i], err_msg=f"request {i}")


def test_bench_device_runs_on_the_cpu_fake(tmp_path, load_script):
    """scripts/bench_device.py (what a GPU session runs first) works end to end on the CPU fake:
    graph and eager codes agree, no host sync in steady steps, a throughput row per concurrency."""
    import json

    module = load_script("bench_device")
    out = tmp_path / "report.json"
    code = module.main(["--device", "cpu", "--preset", "tiny-0.6b", "--concurrency", "1,2", "--frames", "3",
                        "--sync-steps", "2", "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0
    assert report["graph_equals_eager"] is True
    assert report["host_syncs"].startswith("0 host syncs in 2 steps")
    assert [row["concurrency"] for row in report["omnitts"]] == [1, 2]
    assert all(row["frames_per_s"] > 0 and row["steps"] > 0 for row in report["omnitts"])


def test_capture_orders_the_state_copies_around_the_side_stream_warm_up():
    """The clones that undo the warm-up are taken on the current stream *before* the side stream is told
    to wait for it, so the warm-up's writes on the side stream cannot overtake them; the restore runs only
    after the current stream has waited for the side one. Checked on a fake device API that logs the
    stream calls beside the tensor copies (a busy GPU would otherwise restore already-changed state)."""
    import contextlib

    from torch.overrides import TorchFunctionMode

    from omnitts.device.accelerator import AcceleratorBackend

    log = []

    class FakeStream:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            log.append(f"{self.name} waits for {other.name}")

    class Api:
        current = FakeStream("current")

        def Stream(self):
            return FakeStream("side")

        def current_stream(self):
            return self.current

        @contextlib.contextmanager
        def stream(self, stream):
            log.append(f"on {stream.name}")
            yield
            log.append(f"off {stream.name}")

        @contextlib.contextmanager
        def graph(self, graph, pool=None):
            log.append("capture")
            yield

    class Backend(AcceleratorBackend):
        name = "fake"
        api = Api()

        def new_graph(self, fn, restore, output, inputs):
            return object()

    class Copies(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.clone, torch.Tensor.copy_):
                log.append(func.__name__)
            return func(*args, **(kwargs or {}))

    state = [torch.zeros(3), torch.ones(2)]
    with Copies():
        Backend(eager=False).capture(lambda: state[0].add_(1), None, state, state[0])
    assert log.count("on side") == 1  # one warm-up run
    wait_side, wait_current = log.index("side waits for current"), log.index("current waits for side")
    assert [i for i, entry in enumerate(log) if entry == "clone"] == [wait_side - 2, wait_side - 1], log
    assert log.index("on side") > wait_side and wait_current > log.index("off side"), log
    assert all(i > wait_current for i, entry in enumerate(log) if entry == "copy_"), log
    assert log[-1] == "capture", log


def test_the_fake_rejects_every_host_sync_a_device_graph_cannot_record():
    """Syncs that reach the device through the dispatcher (boolean-mask indexing, one-argument where,
    masked_select, repeat_interleave by a tensor, nonzero, a scalar read) and `.cpu()`, which on the CPU
    fake dispatches nothing at all, each refuse to be captured; static-shape look-alikes are fine."""
    backend = FakeGraphBackend()
    x = torch.arange(4.0)
    state = [torch.zeros(4), torch.ones(4, dtype=torch.long)]
    mask = torch.tensor([True, False, True, False])
    bad = {
        "boolean-mask index": lambda: state[0][:2].copy_(x[mask]),
        "one-argument where": lambda: state[1][:2].copy_(torch.where(mask)[0]),
        "masked_select": lambda: state[0][:2].copy_(x.masked_select(mask)),
        "repeat_interleave by a tensor": lambda: state[0].copy_(x[:2].repeat_interleave(torch.tensor([1, 3])[:2])),
        "nonzero": lambda: state[1][:2].copy_(x.nonzero()[:2, 0]),
        "scalar read": lambda: state[0].add_(x.sum().item()),
        "cpu": lambda: state[0].copy_(x.cpu()),
    }
    for name, fn in bad.items():
        with pytest.raises(GraphRuleError):
            capture(backend, fn, state)
    fine = [lambda: state[0].copy_(torch.where(mask, x, -x)), lambda: state[0].copy_(x.masked_fill(mask, 0.0)),
            lambda: state[0].copy_(x[:2].repeat_interleave(2)), lambda: state[1].copy_(x.long()[torch.arange(4)])]
    for fn in fine:
        capture(backend, fn, state).replay()


def test_the_fake_trace_names_the_op_whose_output_shape_changed():
    """The trace records outputs too, so a shape the data decides is reported at the op that made it
    (bincount), not at the first op that happens to consume it."""
    backend = FakeGraphBackend()
    state = [torch.zeros(1), torch.zeros(1, dtype=torch.long), torch.zeros(1)]  # the last is the output

    def frame():  # bincount's length is the data's largest value + 1: a shape the data decides
        state[0].add_(torch.bincount(state[1]).sum())
        state[1].add_(1)

    graph = capture(backend, frame, state)
    with pytest.raises(GraphRuleError, match=r"differs from the capture \(op \d+: captured aten\.bincount"):
        graph.replay()
        graph.replay()


def test_pinned_transfers_wait_for_their_event_only_when_read_and_hand_out_owned_copies():
    """The real accelerator copy path (PinnedTransfer), with a stub device API: the copy is enqueued
    with no wait (no host sync on the step's path), `result()` waits on that copy's own event, every
    copy gets a fresh buffer, and what `result()` returns owns its memory (never a view of a buffer
    that a later copy could overwrite: the bug class of vllm-omni #3164)."""
    from omnitts.device.accelerator import PinnedTransfer

    log = []

    class Event:
        def __init__(self):
            self.number = sum(entry[0] == "event" for entry in log)
            log.append(("event", self.number))

        def record(self):
            log.append(("record", self.number))

        def synchronize(self):
            log.append(("wait", self.number))

    api = type("Api", (), {"Event": Event})
    buffers = []

    def empty(shape, dtype):
        buffers.append(torch.empty(shape, dtype=dtype))
        return buffers[-1]

    first_codes, second_codes = torch.arange(16).reshape(1, 16), torch.arange(16, 32).reshape(1, 16)
    first, second = PinnedTransfer(api, first_codes, empty), PinnedTransfer(api, second_codes, empty)
    assert log == [("event", 0), ("record", 0), ("event", 1), ("record", 1)]  # nothing waited for yet
    assert buffers[0].data_ptr() != buffers[1].data_ptr()  # a fresh buffer per copy
    got = second.result()
    assert log[-1] == ("wait", 1) and ("wait", 0) not in log  # each result waits for its own copy only
    assert np.array_equal(got, second_codes.numpy()) and not np.shares_memory(got, buffers[1].numpy())
    buffers[1].fill_(-1)  # the buffer reused or overwritten later: what was handed out stays
    assert np.array_equal(got, second_codes.numpy())
    assert np.array_equal(first.result(), first_codes.numpy()) and log[-1] == ("wait", 0)


def test_captures_are_lazy_one_per_step_into_one_pool_and_clone_only_the_small_state(cv):
    """Issue 33/37 capture budget: a graph is captured when a frame first needs its bucket, at most one
    per step (the running rows wait for one capture, never for the whole ladder), with one warm-up frame;
    every plan of an engine captures into the engine's one pool; a capture clones only the slots' small
    per-row state (never the K/V cache) and frees it before the capture runs."""
    from torch.overrides import TorchFunctionMode

    pools, cloned = [], []

    class Recording(FakeGraphBackend):
        def graph_pool(self):
            pools.append(object())
            return pools[-1]

        def capture(self, fn, pool, restore, output, inputs=None):
            assert pool is pools[0], "a capture outside the engine's pool"
            with Clones():  # the accelerator's warm-up clones, and the fake's own for its executing capture
                return super().capture(fn, pool, restore, output, inputs)

    class Clones(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.Tensor.clone:
                cloned.append(out.numel() * out.element_size())
            return out

    backend = Recording()
    engine = Engine(cv.ckpt, EngineConfig(max_num_seqs=4, max_positions=512), backend=backend)
    small = sum(t.numel() * t.element_size() for t in engine.state.written())
    kv = sum(t.numel() * t.element_size() for t in engine.cache.tensors())
    assert small * 4 < kv  # the test can tell the two apart
    # Four greedy rows run first (the greedy plan), then sampled ones join (a second plan), one pool.
    jobs = [(p, cv.default_params(i < 4, max_frames=3 + 2 * i, seed=i)) for i, p in enumerate(prompts(cv, 6))]
    for i, (prompt, params) in enumerate(jobs):
        engine.add(prompt, params, tag=i)
    per_step = []
    while engine.has_work():
        before, cloned[:] = len(backend.captured), []
        engine.step()
        per_step.append(len(backend.captured) - before)
        assert sum(cloned) <= 2 * small, "a capture cloned more than the per-row state (the K/V cache?)"
        assert bool(cloned) == (per_step[-1] == 1)
    assert len(engine.steps) >= 2 and len(pools) == 1  # several plans, one pool
    assert max(per_step) == 1 and sum(per_step) == len(backend.captured) >= 3
    assert all(graph.replays for graph in backend.captured)  # nothing captured that the run did not use
    stats = engine.graph_stats()
    assert stats["captures"] == len(backend.captured) == stats["warmup_frames"] and stats["capture_seconds"] > 0


def test_synth_through_fake_graphs_equals_eager_and_reports_the_capture_cost(ckpt_dir, tmp_path, monkeypatch):
    """The whole `omnitts synth` loop (prefill, admission, compaction, codec, files) on the CPU fake's graphs
    (the frames', and the codec's fixed-shape calls') gives the eager run's codes, greedy and seeded, and its
    audio within a PCM step; `--verbose` says what capture cost."""
    import json

    rows = [{"id": f"l{i}", "text": TEXTS[i % len(TEXTS)], "language": "english", "speaker": "ryan",
             "max_seconds": 0.32 + 0.24 * i, "seed": i} for i in range(5)]  # 4..20 frames: rows finish apart
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for greedy in ("--greedy", "--no-greedy"):
        _synth_graphed_vs_eager(ckpt_dir, tmp_path / greedy, manifest, rows, greedy, monkeypatch)


def _synth_graphed_vs_eager(ckpt_dir, tmp_path, manifest, rows, greedy, monkeypatch):
    from typer.testing import CliRunner

    import soundfile as sf

    from omnitts.cli import app
    from omnitts.engine import engine as engine_module
    from omnitts.engine import pipeline as pipeline_module

    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "--dtype", "float32", "--max-batch", "3",
            greedy, "--save-codes", "-q", "--verbose"]
    eager = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "eager")])
    assert eager.exit_code == 0, eager.output
    assert "graph capture: none (frames ran eagerly" in eager.output
    made = []

    def fake(name, eager=False):
        made.append(FakeGraphBackend(eager=eager))
        return made[-1]

    codec_made = []

    def codec_fake(name, eager=False):
        codec_made.append(FakeGraphBackend(eager=eager))
        return codec_made[-1]

    monkeypatch.setattr(engine_module, "get_backend", fake)
    monkeypatch.setattr(pipeline_module, "get_backend", codec_fake)  # the codec's calls, in fixed shapes
    graphed = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "graphs")])
    monkeypatch.undo()
    assert graphed.exit_code == 0, graphed.output
    captured = [graph for backend in made for graph in backend.captured]
    assert captured and all(graph.replays for graph in captured)
    assert f"graph capture: {len(captured)} graphs in " in graphed.output
    assert f"{len(captured)} eager warm-up frames" in graphed.output
    codec = [graph for backend in codec_made for graph in backend.captured]
    assert codec and all(graph.replays for graph in codec)
    assert f"\ncodec graph capture: {len(codec)} graph{'s' if len(codec) > 1 else ''} in " in graphed.output
    for row in rows:
        np.testing.assert_array_equal(np.load(tmp_path / "graphs" / f"{row['id']}.codes.npy"),
                                      np.load(tmp_path / "eager" / f"{row['id']}.codes.npy"), err_msg=row["id"])
        got, _ = sf.read(tmp_path / "graphs" / f"{row['id']}.wav", dtype="float32")
        want, _ = sf.read(tmp_path / "eager" / f"{row['id']}.wav", dtype="float32")
        assert got.shape == want.shape and np.abs(got - want).max() <= 2 / 32768, row["id"]  # 16-bit PCM: +-1 step


def test_the_next_call_reuses_the_last_engine_and_its_graphs_on_graph_devices(tts_factory, monkeypatch):
    """A notebook's second `synthesize` on a graph device reuses the first call's idle engine: no new engine,
    no new capture, the same codes; `release_engine()` frees it; an eager (CPU) run keeps nothing."""
    from omnitts.engine import engine as engine_module

    tts = tts_factory("custom_voice", max_batch=2)
    texts = TEXTS[:3]
    eager = [a.codes for a in tts.synthesize(texts, speaker="ryan", greedy=True, max_frames=5)]
    assert tts.idle_engine is None  # nothing captured, nothing kept
    made = []

    def fake(name, eager=False):
        made.append(FakeGraphBackend(eager=eager))
        return made[-1]

    monkeypatch.setattr(engine_module, "get_backend", fake)
    try:
        first = [a.codes for a in tts.synthesize(texts, speaker="ryan", greedy=True, max_frames=5)]
        kept, captured = tts.idle_engine, len(made[0].captured)
        assert kept is not None and captured and len(made) == 1
        second = [a.codes for a in tts.synthesize(texts[:2], speaker="ryan", greedy=True, max_frames=4)]
        assert len(made) == 1 and len(made[0].captured) == captured and tts.idle_engine is kept
        assert sum(graph.replays for graph in made[0].captured) > captured  # replayed by the second call too
        longer = tts.synthesize(texts[0], speaker="ryan", greedy=True, max_frames=60)  # needs more positions
        assert len(made) == 2 and tts.idle_engine is not kept and len(longer.codes) == 60
        tts.release_engine()
        assert tts.idle_engine is None
    finally:
        tts.release_engine()
    for a, b in zip(first, eager):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(second, eager):
        np.testing.assert_array_equal(a, b[:4])


def test_capture_runs_under_the_device_apis_sync_debug_mode_where_it_has_one():
    """CUDA and torch_npu >= 2.5 (`set_sync_debug_mode`): a capture runs in "error" mode and the previous mode
    comes back after it, also when the capture fails; an API without the switch captures unchecked."""
    import contextlib
    import types

    from omnitts.device.accelerator import AcceleratorBackend

    modes = []

    class Stream:
        def wait_stream(self, other):
            pass

    def api(with_switch):
        mode = {"now": "warn"}
        extra = {}
        if with_switch:
            extra = dict(get_sync_debug_mode=lambda: mode["now"],
                         set_sync_debug_mode=lambda m: (modes.append(m), mode.update(now=m)))

        @contextlib.contextmanager
        def graph(graph, pool=None):
            modes.append(f"capture in {mode['now']}")
            yield

        return types.SimpleNamespace(Stream=Stream, current_stream=Stream, stream=lambda s: contextlib.nullcontext(),
                                     graph=graph, **extra)

    def backend(with_switch):
        class Backend(AcceleratorBackend):
            name = "stub"

            def new_graph(self, fn, restore, output, inputs):
                return object()

        Backend.api = api(with_switch)
        return Backend(eager=False)

    state = [torch.zeros(2)]
    for with_switch, want in ((True, ["error", "capture in error", "warn"]), (False, ["capture in warn"])):
        modes.clear()
        backend(with_switch).capture(lambda: state[0].add_(1), None, state, state[0])
        assert modes == want, modes
    modes.clear()
    backend = backend(True)
    with pytest.raises(RuntimeError, match="boom"):
        backend.capture(lambda: (_ for _ in ()).throw(RuntimeError("boom")) if modes else None, None, state, state[0])
    assert modes[-1] == "warn"
