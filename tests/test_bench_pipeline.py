"""scripts/bench_device.py --pipeline (scripts/bench_pipeline.py): the whole `omnitts synth` pipeline,
timed, on the CPU at tiny shapes; and the pieces a GPU run relies on that the CPU can still check (the
attention-kernel names, the sync-debug switch and its allowed waits)."""

import json
import warnings

import pytest


def test_pipeline_bench_runs_synth_end_to_end_on_the_cpu(tmp_path, load_script):
    """One command runs synth on a manifest it writes and reports sane figures: every line a file,
    audio-s/s > 0, first audio within the process's wall time, the split summing to the synth wall."""
    bench = load_script("bench_device")
    out = tmp_path / "pipeline.json"
    code = bench.main(["--pipeline", "--lines", "6", "--seconds", "0.3,0.8", "--max-batch", "4",
                       "--sync-debug", "error", "--work", str(tmp_path / "work"), "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0
    assert report["lines"] == 6 and report["bandwidth_gbs"] > 0 and "bytes/step" in report["roofline_formula"]
    manifest = [json.loads(line) for line in (tmp_path / "work" / "manifest.jsonl").read_text().splitlines()]
    assert len(manifest) == 6 and all(0.3 <= line["max_seconds"] <= 0.8 for line in manifest)
    (run,) = report["runs"]
    assert "failed" not in run, run
    assert run["files"] == 6 and run["errors"] == [] and run["exit_code"] == 0
    assert 0 < run["audio_s"] <= report["budget_s"] + 0.1
    assert run["audio_s_per_s"] > 0 and run["steady_audio_s_per_s"] > 0
    assert 0 < run["loaded_s"] <= run["first_frame_s"] <= run["first_audio_s"] <= run["process_wall_s"]
    split = run["split_s"]
    assert set(split) == {"load", "capture", "engine", "codec", "prepare", "write", "host"}
    assert all(v >= 0 for v in split.values()), split
    assert split["engine"] > 0 and split["load"] > 0 and split["write"] > 0
    # The codec decodes every frame (pump_later, and the wait for its audio): a share of the engine's time,
    # not the ~0 of timing a method the pipeline no longer calls.
    assert split["codec"] > 0.05 * split["engine"], split
    shapes = run["shapes"]  # the eager calls whose shapes vary (new cuDNN plans on CUDA)
    assert shapes["prefills"] == len(manifest) and 1 <= shapes["prefill_lengths"] <= len(manifest)
    assert 1 <= shapes["codec_call_shapes"] <= shapes["codec_calls"]
    assert sum(split.values()) == pytest.approx(run["wall_s"], rel=0.01)
    assert run["peak_memory_gib"] > 0 and run["peak_memory_kind"] == "ru_maxrss"
    assert run["steps"] > 0 and run["frames"] > 0 and run["kv_positions_read"] >= run["frames"]
    roof = run["roofline"]
    assert 0 < roof["of_roofline"] < 1 and roof["bytes_per_step"] > run["weight_bytes_per_frame"]
    assert run["attention"] == "unknown"  # the CPU: no profiler names a kernel
    assert run["sync_debug"].startswith("skipped")  # the CPU has no sync debug mode


def test_attention_kernel_names(load_script):
    bench = load_script("bench_pipeline")
    assert bench.classify_attention(["aten::linear", "aten::scaled_dot_product_attention",
                                     "aten::_scaled_dot_product_flash_attention", "aten::_flash_attention_forward"]) == "flash"
    assert bench.classify_attention(["aten::_scaled_dot_product_efficient_attention",
                                     "aten::_efficient_attention_forward"]) == "efficient"
    assert bench.classify_attention(["aten::_scaled_dot_product_attention_math", "aten::bmm"]) == "math"
    assert bench.classify_attention(["aten::_scaled_dot_product_cudnn_attention"]) == "cudnn"
    assert bench.classify_attention(["npu::npu_fusion_attention"]) == "npu_fusion_attention"
    assert bench.classify_attention(["aten::scaled_dot_product_attention", "aten::softmax"]) == "unknown"
    assert bench.attention_kernel(None, "cpu") == "unknown"


class _FakeSyncModule:
    """Stands in for torch.cuda / torch.npu: records the sync debug modes set."""

    def __init__(self):
        self.modes = []

    def set_sync_debug_mode(self, mode):
        self.modes.append(mode)


def test_sync_watch_turns_the_mode_off_only_in_allowed_calls(load_script):
    bench = load_script("bench_pipeline")
    module = _FakeSyncModule()
    watch = bench.SyncWatch(module, "error")

    class Engine:
        def _collect(self):
            return module.modes[-1]

        def frame_steps(self):
            return module.modes[-1]

    watch.allow(Engine, "_collect")
    watch.allow(Engine, "frame_steps", "capture: ")
    watch.on()
    assert Engine()._collect() == 0 and module.modes[-1] == "error"
    assert Engine().frame_steps() == 0 and module.modes[-1] == "error"  # error mode: capture is exempt
    watch.stop()
    assert Engine()._collect() == 0 and module.modes[-1] == 0  # after the run: stays off


def test_sync_watch_counts_warned_syncs_by_phase(load_script):
    bench = load_script("bench_pipeline")
    module = _FakeSyncModule()
    with warnings.catch_warnings():  # SyncWatch's filter and showwarning are undone on the way out
        watch = bench.SyncWatch(module, "warn")

        class Backend:
            def frame_steps(self):
                warnings.warn("called a synchronizing CUDA operation")
                return module.modes[-1]

        watch.allow(Backend, "frame_steps", "capture: ")
        watch.on()
        # The notice CUDA prints when the mode is first set (seen on an H200) is not a sync.
        warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                      "synchronizing operations", UserWarning)
        assert Backend().frame_steps() == "warn"  # warn mode: capture's syncs are listed, not hidden
        warnings.warn("called a synchronizing CUDA operation")
        watch.stop()
    assert dict(watch.sites) == {"capture: (outside omnitts)": 1, "(outside omnitts)": 1}
    assert bench.sync_verdict(watch, []).startswith("1 host syncs outside")
    assert bench.sync_verdict(None, []).startswith("skipped")


def test_summary_line_of_a_run_whose_items_all_failed(load_script):
    """A --sync-debug error run where every item failed has no first audio and no roofline: the line
    still prints, with "-", and names the first error."""
    bench = load_script("bench_pipeline")
    row = {"preset": "0.6b", "max_batch": 8, "audio_s_per_s": 0.0, "steady_audio_s_per_s": 0.0, "files": 0,
           "first_audio_s": None, "first_frame_s": None, "capture_s": 1.5, "peak_memory_gib": 2.0,
           "peak_memory_kind": "torch.cuda.max_memory_allocated", "roofline": {}, "wall_s": 3.0,
           "split_s": {"load": 1.0, "engine": 2.0}, "attention": "flash", "sdp_enabled": "flash,math",
           "sync_debug": "2 items failed on a host sync outside Engine._collect", "sync_sites": {},
           "errors": ["s00000: RuntimeError while preparing: called a synchronizing CUDA operation", "s00001: x"]}
    line = bench.summary_line(row, 2)
    assert "first audio - s" in line and "-% of the roofline" in line and "0/2 files" in line
    assert "2 items failed, first: s00000: RuntimeError" in line and "sdpa backends allowed: flash,math" in line


def test_pipeline_bench_times_graph_capture_on_the_cpu_fake(tmp_path, load_script):
    """With the CPU fake of device graphs the engines capture as on a GPU: capture time is reported
    apart from the engine's, and the split still sums to the wall."""
    bench = load_script("bench_pipeline")
    out = tmp_path / "pipeline.json"
    code = bench.main(["--lines", "4", "--seconds", "0.3,0.6", "--max-batch", "2", "--fake-graphs",
                       "--json", str(out)])
    (run,) = json.loads(out.read_text())["runs"]
    assert code == 0 and run["files"] == 4
    assert run["capture_s"] > 0 and run["split_s"]["capture"] == pytest.approx(run["capture_s"], abs=1e-3)
    assert sum(run["split_s"].values()) == pytest.approx(run["wall_s"], rel=0.01)
    start = run["startup_s"]  # the wait for the first frame by phase: they add up to it
    assert list(start) == ["imports", "load", "prompts", "first_steps", "capture"]
    assert all(v >= 0 for v in start.values()) and start["imports"] > 0 and start["load"] > 0
    assert sum(start[k] for k in ("imports", "load", "prompts", "first_steps")) == pytest.approx(
        run["first_frame_s"], abs=0.01)
    assert 0 < start["capture"] <= start["first_steps"] + 0.01  # the first frame's graph was captured before it
    assert "; start-up: imports " in bench.summary_line(run, 4)


def test_pipeline_bench_null_device_measures_the_hosts_own_work_per_step(tmp_path, load_script):
    """--null-device: every graph replays nothing (prefills padded as on a GPU), so lines run to their budgets
    in silence and the report gives the host's own milliseconds per step."""
    bench = load_script("bench_pipeline")
    out = tmp_path / "pipeline.json"
    code = bench.main(["--lines", "4", "--seconds", "0.3,0.6", "--max-batch", "2", "--null-device",
                       "--json", str(out)])
    (run,) = json.loads(out.read_text())["runs"]
    assert code == 0 and run["files"] == 4 and run["steps"] > 4
    assert run["frames"] == sum(round(12.5 * s) for s in _budgets(tmp_path, bench, 4, (0.3, 0.6)))  # no EOS
    assert run["host_ms_per_step"] > 0 and run["shapes"]["prefills_padded"] == run["shapes"]["prefills"] == 4
    assert "null device: the host's own work" in bench.summary_line(run, 4)


def _budgets(tmp_path, bench, lines, seconds):
    """The `max_seconds` of the bench's manifest (the same seeded draw)."""
    path = tmp_path / "m.jsonl"
    bench.write_manifest(path, lines, seconds)
    return [json.loads(line)["max_seconds"] for line in path.read_text().splitlines()]


def test_bench_device_checks_npu_syncs_with_its_debug_mode_when_torch_npu_has_one(tts_factory, load_script,
                                                                                  monkeypatch):
    """bench_device.py's host-sync check uses torch.npu.set_sync_debug_mode where torch_npu has it (2.5+):
    on for the steady steps, off inside `_collect` only; without it the check is skipped with a message.
    Stubbed: a `torch.npu` that records the modes, over a CPU engine."""
    import types

    import torch

    bench = load_script("bench_device")
    tts = tts_factory("custom_voice")
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(), raising=False)
    assert bench.count_syncs(tts, None, "npu", 2).startswith("skipped: torch.npu has no set_sync_debug_mode")
    modes = []
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(set_sync_debug_mode=modes.append), raising=False)
    eng = bench.engine(tts, "cpu", True, 2, 256)
    collects = []
    collect = eng._collect
    eng._collect = lambda pending: collects.append(modes[-1] if modes else None) or collect(pending)
    verdict = bench.count_syncs(tts, eng, "npu", 3)
    assert verdict == "0 host syncs in 3 steps (outside the one wait in _collect)"
    assert modes[0] == "error" and modes[-1] == 0
    assert modes.count("error") == 1 + 3 and modes.count(0) == 1 + 3  # on once, off/on around each collect
    assert "error" not in collects and collects.count(0) >= 3  # no collect ran with the mode on


def test_a_run_that_times_out_is_reported_and_the_others_go_on(tmp_path, load_script):
    bench = load_script("bench_pipeline")
    spec = {"preset": "tiny-0.6b", "max_batch": 4, "out": str(tmp_path / "out"), "report": str(tmp_path / "r.json"),
            "manifest": "-", "ckpt": "-", "device": "cpu", "dtype": "float32", "sync_debug": None,
            "attention": False}
    row = bench.run_one(spec, tmp_path, timeout=0.01)
    assert row["failed"].startswith("timed out") and "FAILED (timed out" in bench.summary_line(row, 1)


def test_profile_writes_the_python_profile_and_the_kernel_window(tmp_path, load_script):
    """--profile: per run, cProfile's top functions and the torch profiler's window of steady steps (a run
    too short for the window says so); the split still sums to the wall."""
    bench = load_script("bench_pipeline")
    out, prof = tmp_path / "pipeline.json", tmp_path / "prof"
    code = bench.main(["--lines", "3", "--seconds", "0.3,0.6", "--max-batch", "2", "--profile", str(prof),
                       "--json", str(out)])
    (run,) = json.loads(out.read_text())["runs"]
    assert code == 0 and run["files"] == 3
    assert sum(run["split_s"].values()) == pytest.approx(run["wall_s"], rel=0.01)
    python = (prof / "cprofile-tiny-0.6b-2.txt").read_text()
    assert "function calls" in python and "Ordered by: cumulative time" in python
    assert "omnitts" in python  # the run's own functions were profiled (which ones lead depends on the CPU)
    assert "no steady steps profiled" in (prof / "kernels-tiny-0.6b-2.txt").read_text()
