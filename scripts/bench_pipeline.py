"""The whole pipeline on one device: `omnitts synth` end to end on a Seed-TTS-like manifest, timed.

    python scripts/bench_device.py --pipeline --device cuda --json pipeline.json    # 0.6b and 1.7b, max batch 8..128
    python scripts/bench_device.py --pipeline                                       # the CPU, tiny shapes (minutes)

(`scripts/bench_pipeline.py` takes the same options.) For each preset it builds a random CustomVoice
checkpoint (`omnitts.testing.checkpoint`) and writes a manifest of `--lines` one-sentence lines. Random
weights never pick EOS, so each line carries its own frame budget (`max_seconds`, drawn uniformly from
`--seconds`, 2-8 s by default, with a fixed RNG; the sentence's length follows it at ~2.5 words a
second). Then, per `--max-batch`, one child process runs `omnitts synth` in-process (the CLI's own
code: manifest, output directory, ledger, files) with cheap timers wrapped around a few functions, and
reports:
- audio_s_per_s: seconds of audio written per wall second of the synth call (load, warm-up and codec
  included); `steady_audio_s_per_s` counts from the first frame on;
- first_audio_s: process start to the first file committed (imports and load included); first_frame_s:
  process start to the end of the first engine step that produced a frame; `startup_s` splits that wait:
  imports (process start to the bench's imports done: Python, torch, omnitts), load (to the checkpoint
  loaded: CLI, manifest, weights, kernel checks), prompts (to the first engine step: the first wave's
  prompts built), first_steps (to the first frame: prefills and the first frame's capture, of which
  `capture` seconds were capturing);
- capture_s: graph capture (warm-up runs included; `GraphSteps._capture`, when a frame first needs a bucket, and
  `CallGraphs.capture`, when a codec call shape or a prefill length bucket first comes up);
- peak_memory_gib: torch.<device>.max_memory_allocated(), or on the CPU the process's ru_maxrss;
- split_s: the synth call's wall time by where it went, exclusive (a timer inside another is subtracted
  from it): load, capture, engine (Engine.step less capture), codec (CodecStreams.pump_later, the wait for
  its audio in Samples.result, CodecStreams.close), prepare (TTS.prepare: tokenizing, prompts), write
  (AudioSink.write, Batch.save, where the main thread runs them), host (the rest: manifest, scheduling,
  Python); background_s: the same timers on other threads (the saver's writes), beside the wall. The timers are
  perf_counter pairs around whole calls; no device sync is added: the engine's time holds its own wait
  for the frame in flight (`Engine._collect`, one frame behind), and the codec's its wait for its audio;
  so device time lands where it is waited for, and work still queued when a timer stops is billed to
  whichever timer waits for it next (one device synchronize closes the run, outside any step). With
  `--profile DIR` the timers synchronize the device at each start and stop, so each part owns its device
  time (a diagnosis: the syncs and the profilers slow the run), and DIR gets per run cProfile's top
  functions (cprofile-PRESET-BATCH.txt) and torch.profiler's table of steps 60..70 (kernels-...txt);
- roofline: bytes a step must read = weight bytes per frame (`bench_lib.frame_bytes`: the talker's
  layers once, the code predictor once per pass, its heads) + talker K/V bytes per position x the mean
  K/V positions a step reads (sum over finished requests of F*P + F*(F-1)/2, F frames after P prompt
  positions, over the steps run); the roofline time is steps x bytes / `--bandwidth`, and
  `of_roofline` = that time / the synth wall (`of_roofline_engine`: / the engine's time).
With `--sync-debug error`, host syncs raise (`torch.<device>.set_sync_debug_mode("error")`: CUDA, and
NPU with torch_npu >= 2.5) from the end of the load to the end of the run, except inside
`Engine._collect`, the one allowed wait, and graph capture (start-up; torch.cuda.graph itself syncs):
an item that hits one fails with the error, and the report lists them. `--sync-debug warn` lets the
run go on and counts the syncs by the innermost omnitts line that made them (`sync_sites`).
`--fake-graphs` (CPU) gives the engines the CPU fake of device graphs, so capture is timed as on a GPU.
`--null-device` (CPU) measures the host's own work: every graph (frames, prefills padded as on a GPU,
codec calls) is captured as nothing and replays nothing, so codes stay 0 (each line runs to its budget)
and the audio is silence, and the wall is what the host spends a step (admission, scheduling, codec
feeding, writing): the least a device step can take before the host, not the device, sets the pace
(`host_ms_per_step`).
`attention` names the attention kernels one eager frame ran (profiler op names; the captured frame
records the same ops): flash / efficient / cudnn / math on CUDA, the fused NPU kernels; "unknown"
where no profiler names them (the CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEAKERS = ["ryan", "vivian", "serena", "aiden"]
WORDS = ("the morning train left the station before the rain began to fall on the quiet town while "
         "children walked to school and the old baker opened his shop with a warm smile for every "
         "neighbour who came looking for fresh bread and a little news about the weekend market").split()
WORDS_PER_SECOND = 2.5
# Nominal HBM read bandwidth (GB/s) by device name: H100 SXM 3.35 TB/s, H200 4.8 TB/s.
BANDWIDTHS = (("H200", 4800.0), ("H100", 3350.0))
DEFAULT_BANDWIDTH = 3350.0
# Profiler op names -> attention kernel (CUDA sdpa backends, torch_npu's fused kernels).
ATTENTION_OPS = (("flash", "flash"), ("efficient_attention", "efficient"), ("cudnn_attention", "cudnn"),
                 ("attention_math", "math"), ("npu_fusion_attention", "npu_fusion_attention"),
                 ("npu_fused_infer_attention_score", "npu_fused_infer_attention_score"))


# -- the parent: manifests, child runs, the report ---------------------------------------------------
def write_manifest(path: Path, lines: int, seconds: tuple[float, float], seed: int = 0) -> float:
    """A Seed-TTS-like manifest: `lines` one-sentence lines, each with a `max_seconds` budget drawn from
    `seconds` with a fixed RNG; returns the budgets' total seconds."""
    rng = random.Random(seed)
    total = 0.0
    with open(path, "w") as f:
        for i in range(lines):
            budget = round(rng.uniform(*seconds), 2)
            total += budget
            words = [rng.choice(WORDS) for _ in range(max(3, round(budget * WORDS_PER_SECOND)))]
            text = " ".join(words).capitalize() + "."
            f.write(json.dumps({"id": f"s{i:05d}", "text": text, "speaker": SPEAKERS[i % len(SPEAKERS)],
                                "max_seconds": budget}) + "\n")
    return total


def bandwidth_for(device: str, given: float | None) -> tuple[float, str]:
    """(GB/s, where it came from): `--bandwidth`; else on CUDA the device name's nominal figure (H100 SXM's
    when the name is not known); on the CPU a read of 256 MiB, measured here (`bench_lib.bandwidth`)."""
    if given is not None:
        return given, "--bandwidth"
    if device == "cpu":
        sys.path.insert(0, str(ROOT / "scripts"))
        from bench_lib import bandwidth

        return round(bandwidth(1 << 28)["read_gbs"], 1), "measured: a 256 MiB read on this CPU"
    if device == "cuda":
        import torch

        name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
        for key, value in BANDWIDTHS:
            if key in name:
                return value, f"nominal for {name}"
    return DEFAULT_BANDWIDTH, "nominal H100 SXM (default; pass --bandwidth for this device)"


def run_one(spec: dict, work: Path, timeout: float, keep: bool = False) -> dict:
    """One child process running `omnitts synth` on the spec; returns its report (or the failure). The
    output directory is deleted once its files are counted unless `keep` (1,000 lines: ~250 MB of WAV)."""
    spec_path = work / f"spec-{spec['preset']}-{spec['max_batch']}.json"
    spec_path.write_text(json.dumps(spec))
    shutil.rmtree(spec["out"], ignore_errors=True)  # a kept --work: run afresh, not resume
    launched = time.time()
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # this run is lost, the others go on
        return {"preset": spec["preset"], "max_batch": spec["max_batch"], "failed": f"timed out after {timeout:g} s",
                "stderr_tail": []}
    process_wall = time.time() - launched
    report_path = Path(spec["report"])
    if proc.returncode != 0 or not report_path.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"preset": spec["preset"], "max_batch": spec["max_batch"], "failed": f"exit {proc.returncode}",
                "stderr_tail": tail}
    report = json.loads(report_path.read_text())
    report["process_wall_s"] = round(process_wall, 3)
    for name in ("first_audio", "first_frame", "loaded", "imported", "first_step"):  # -> seconds since the launch
        at = report.pop(f"{name}_at")
        report[f"{name}_s"] = None if at is None else round(at - launched, 3)
    report["startup_s"] = startup(report)
    out = Path(spec["out"])
    report["files"] = sum(1 for p in out.iterdir() if p.suffix == ".wav")
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return report


def startup(report: dict) -> dict:
    """The wait for the first frame by phase (see the module docstring); {} where a mark is missing."""
    marks = [report.get(f"{name}_s") for name in ("imported", "loaded", "first_step", "first_frame")]
    if any(mark is None for mark in marks):
        return {}
    phases = dict(zip(("imports", "load", "prompts", "first_steps"), (b - a for a, b in zip([0.0, *marks], marks))))
    phases = {name: round(value, 3) for name, value in phases.items()}
    phases["capture"] = report.get("capture_before_first_frame_s")
    return phases


def roofline(report: dict, bandwidth_gbs: float) -> dict:
    """The memory roofline of the run's steps (see the module docstring)."""
    steps = report["steps"]
    if not steps:
        return {}
    mean_positions = report["kv_positions_read"] / steps
    step_bytes = report["weight_bytes_per_frame"] + report["kv_bytes_per_position"] * mean_positions
    seconds = steps * step_bytes / (bandwidth_gbs * 1e9)
    engine = report["split_s"]["engine"]
    return {"bytes_per_step": round(step_bytes), "mean_kv_positions_per_step": round(mean_positions, 1),
            "mean_rows_per_step": round(report["frames"] / steps, 2),
            "step_ms": round(1e3 * step_bytes / (bandwidth_gbs * 1e9), 4), "seconds": round(seconds, 4),
            "audio_s_per_s": round(report["audio_s"] / seconds, 1),
            "of_roofline": round(seconds / report["wall_s"], 4),
            "of_roofline_engine": round(seconds / engine, 4) if engine > 0 else None}


FORMULA = ("bytes/step = weights per frame (talker layers once + code predictor x passes + heads) "
           "+ 2 x layers x kv_heads x head_dim x itemsize x mean K/V positions per step; "
           "roofline s = steps x bytes/step / bandwidth; of_roofline = roofline s / synth wall")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--device", choices=["cpu", "cuda", "npu"], default="cpu")
    parser.add_argument("--presets", help="comma list (default 0.6b,1.7b; cpu: tiny-0.6b)")
    parser.add_argument("--max-batch", dest="max_batches", help="comma list (default 8,32,64,128; cpu: 4,8)")
    parser.add_argument("--lines", type=int, help="manifest lines (default 1000; cpu: 24)")
    parser.add_argument("--seconds", default="2,8", help="MIN,MAX seconds of speech per line (default 2,8)")
    parser.add_argument("--dtype", help="default: bfloat16 on cuda/npu, float32 on cpu")
    parser.add_argument("--bandwidth", type=float, help="device read bandwidth, GB/s, for the roofline "
                        "(default: 4800 on an H200, else 3350, the H100 SXM's; cpu: measured)")
    parser.add_argument("--sync-debug", choices=["error", "warn"], help="host syncs outside Engine._collect "
                        "raise (error: the items fail) or are counted by the omnitts line that made them (warn)")
    parser.add_argument("--fake-graphs", action="store_true", help="cpu: engines capture and replay through the "
                        "CPU fake of device graphs (omnitts/device/fake.py), so the capture path runs as on a GPU")
    parser.add_argument("--null-device", action="store_true", help="cpu: graphs that do nothing (no device work), "
                        "to measure the host's own cost per step")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per synth process (default 1800)")
    parser.add_argument("--work", type=Path, help="keep checkpoints, manifests and outputs here")
    parser.add_argument("--profile", type=Path, help="diagnose, not time: the timers synchronize the device (each "
                        "part owns its device time), and per run DIR gets cProfile's top functions and the device "
                        "kernels of 10 steady steps (torch.profiler)")
    parser.add_argument("--deterministic", action="store_true", help="synth with --deterministic (what it costs: "
                        "run once with and once without)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.child is not None:
        return child(json.loads(args.child.read_text()))
    cpu = args.device == "cpu"
    presets = (args.presets or ("tiny-0.6b" if cpu else "0.6b,1.7b")).split(",")
    batches = [int(b) for b in (args.max_batches or ("4,8" if cpu else "8,32,64,128")).split(",")]
    lines = args.lines or (24 if cpu else 1000)
    low, high = (float(s) for s in args.seconds.split(","))
    dtype = args.dtype or ("float32" if cpu else "bfloat16")
    bandwidth, source = bandwidth_for(args.device, args.bandwidth)
    report = {"device": args.device, "dtype": dtype, "lines": lines, "seconds": [low, high],
              "deterministic": args.deterministic,
              "bandwidth_gbs": bandwidth, "bandwidth_source": source, "roofline_formula": FORMULA,
              "machine": machine(args.device), "runs": []}
    print(f"whole pipeline: {args.device} {dtype}, {lines} lines of {low:g}-{high:g} s, presets {presets}, "
          f"max batch {batches}{', --deterministic' if args.deterministic else ''}")
    print(f"roofline: {FORMULA}; bandwidth {bandwidth:g} GB/s ({source})")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        manifest = work / "manifest.jsonl"
        report["budget_s"] = round(write_manifest(manifest, lines, (low, high)), 2)
        for preset in presets:
            sys.path.insert(0, str(ROOT))
            from omnitts.testing.checkpoint import build_checkpoint

            ckpt = build_checkpoint(work / f"ckpt-{preset}", kind="custom_voice", preset=preset)
            for i, batch in enumerate(batches):
                spec = {"preset": preset, "max_batch": batch, "device": args.device, "dtype": dtype,
                        "manifest": str(manifest), "ckpt": str(ckpt), "out": str(work / f"out-{preset}-{batch}"),
                        "report": str(work / f"report-{preset}-{batch}.json"), "sync_debug": args.sync_debug,
                        "attention": i == 0, "fake_graphs": args.fake_graphs and cpu,
                        "null_device": args.null_device and cpu,
                        "profile": str(args.profile) if args.profile else None,
                        "deterministic": args.deterministic}
                row = run_one(spec, work, args.timeout, keep=args.work is not None)
                if "failed" not in row:
                    row["roofline"] = roofline(row, bandwidth)
                report["runs"].append(row)
                print(summary_line(row, lines))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    bad = [r for r in report["runs"] if "failed" in r or r["files"] != lines or r.get("errors")]
    return 1 if bad else 0


def summary_line(row: dict, lines: int) -> str:
    """One run's figures on one line (plus its host-sync sites, if counted); "-" where a figure is missing
    (no item finished: a run whose items all failed)."""
    head = f"{row['preset']:>9} max batch {row['max_batch']:3d}:"
    if "failed" in row:
        return f"{head} FAILED ({row['failed']}): {' | '.join(row['stderr_tail'])}"

    def s(value, digits=2):
        return "-" if value is None else f"{value:.{digits}f}"
    split = ", ".join(f"{k} {v:.2f}" for k, v in row["split_s"].items())
    roof = row["roofline"]
    text = (f"{head} {s(row['audio_s_per_s'])} audio-s/s (steady {s(row['steady_audio_s_per_s'])}), "
            f"{row['files']}/{lines} files, first audio {s(row['first_audio_s'])} s, first frame "
            f"{s(row['first_frame_s'])} s, capture {s(row['capture_s'])} s, peak {s(row['peak_memory_gib'])} GiB "
            f"({row['peak_memory_kind']}), {s(100 * roof['of_roofline']) if roof else '-'}% of the roofline "
            f"({roof.get('audio_s_per_s', '-')} audio-s/s at {roof.get('step_ms', '-')} ms/step); wall "
            f"{s(row['wall_s'])} s = {split}")
    if row.get("startup_s"):
        text += "; start-up: " + ", ".join(f"{k} {s(v)}" for k, v in row["startup_s"].items())
    if row.get("host_ms_per_step") is not None:
        text += f"; null device: the host's own work {row['host_ms_per_step']:.2f} ms a step"
    if row.get("background_s"):
        beside = ", ".join(f"{k} {v:.2f}" for k, v in row["background_s"].items())
        text += f" (beside it, on other threads: {beside})"
    text += f"; attention: {row['attention']}"
    if row.get("sdp_enabled") is not None:
        text += f" (sdpa backends allowed: {row['sdp_enabled']})"
    if row.get("shapes"):
        n = row["shapes"]
        text += (f"; call shapes: {n['codec_calls']} codec calls in {n['codec_call_shapes']} (rows, frames) shapes, "
                 f"{n['prefills']} prefills of {n['prefill_lengths']} lengths ({n['prefills_padded']} padded to "
                 "a graph's length)")
    if row.get("sync_debug"):
        text += f"; host syncs: {row['sync_debug']}"
        text += "".join(f"\n    {n:6d} x {site}" for site, n in list(row.get("sync_sites", {}).items())[:12])
    if row.get("errors"):
        text += f"; {len(row['errors'])} items failed, first: {row['errors'][0]}"
    return text


def machine(device: str) -> str:
    """The device's name (the CPU model from /proc/cpuinfo on the CPU)."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cuda (not available)"
    if device == "npu":
        return "npu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return "cpu"


# -- the child: one synth run with timers ------------------------------------------------------------
class Timers:
    """Exclusive wall time per name: time spent in a timed call nested inside another is billed to the
    inner name only, so the names' sum never exceeds the wall time.

    Calls on other threads (the batch saver's `Batch.save`, `AudioSink.write`) run beside the main thread's:
    they are billed to `background` (per name), not to the wall's split, and never synchronize the device
    (a synchronize from another thread while the main thread captures a graph would break the capture).
    """

    def __init__(self, sync=None):
        self.totals: dict[str, float] = {}
        self.background: dict[str, float] = {}
        self.local = threading.local()  # .stack per thread: [name, start, time of nested timed calls]
        self.sync = sync or (lambda: None)  # --profile: the device's synchronize, so each part owns its device time

    @property
    def stack(self) -> list[list]:
        if not hasattr(self.local, "stack"):
            self.local.stack = []
        return self.local.stack

    def wrap(self, owner, attribute: str, name: str, after=None) -> None:
        """Replace `owner.attribute` with a timed call; `after(result, args, end)` runs after it, untimed."""
        original = getattr(owner, attribute)
        timers = self

        def timed(*args, **kwargs):
            main = threading.current_thread() is threading.main_thread()
            totals, stack = (timers.totals if main else timers.background), timers.stack
            if main:
                timers.sync()
            frame = [name, time.perf_counter(), 0.0]
            stack.append(frame)
            try:
                result = original(*args, **kwargs)
            finally:
                if main:
                    timers.sync()
                end = time.perf_counter()
                stack.pop()
                spent = end - frame[1]
                totals[name] = totals.get(name, 0.0) + spent - frame[2]
                if stack:
                    stack[-1][2] += spent
            if after is not None:
                after(result, args)
            return result

        setattr(owner, attribute, timed)


class KernelWindow:
    """torch.profiler over engine steps FIRST..LAST (steady state, after the first waves' captures): the
    device kernels by total time, and each op's CPU time, written to `path` when the window closes."""

    FIRST, LAST = 60, 70

    def __init__(self, device: str, path: Path):
        self.device, self.path, self.profiler = device, path, None

    def step(self, done: int) -> None:
        if done == self.FIRST:
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
        elif done == self.LAST:
            self.close()

    def close(self) -> None:
        if self.profiler is None:
            if not self.path.exists():
                self.path.write_text(f"the run ended before step {self.FIRST}: no steady steps profiled\n")
            return
        profiler, self.profiler = self.profiler, None
        profiler.__exit__(None, None, None)
        averages = profiler.key_averages()
        steps = self.LAST - self.FIRST
        tables = [f"steps {self.FIRST}..{self.LAST} ({steps} steps) of one synth run"]
        # Device time under its current name, or the older torch's (one table, not the same one twice).
        for keys in (("self_device_time_total", "self_cuda_time_total"), ("self_cpu_time_total",)):
            tables.append(_table(averages, keys))
        self.path.write_text("\n\n".join(tables))


def _table(averages, keys) -> str:
    """The profiler's table sorted by the first of `keys` this torch knows."""
    for key in keys:
        try:
            return f"by {key}:\n" + averages.table(sort_by=key, row_limit=40, max_name_column_width=90)
        except (AttributeError, KeyError, ValueError) as exc:
            missing = exc
    return f"by {keys[-1]}: not available ({missing})"


def count_shapes() -> dict:
    """Counts of the calls whose shapes may change during a run, filled in as it goes: codec calls and
    their distinct (rows, frames) (the padded shapes where the backend fixes them), prefills and their
    distinct prompt lengths, and how many of them ran padded to a bucket (`engine.runner.Prefills`: on
    accelerators outside float32, each bucket one graph). On CUDA each new shape can cost cuDNN a plan built
    on the host (convolutions; attention, where it is on)."""
    from omnitts.engine.runner import Prefills
    from omnitts.models.codec_stream import StreamingCodec
    from omnitts.models.codec_streams import _Call

    counts = {"codec_calls": 0, "codec_call_shapes": 0, "prefills": 0, "prefill_lengths": 0, "prefills_padded": 0}
    codec_seen, prompt_seen = set(), set()

    def wrap(owner, name, note):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            note(*args, **kwargs)
            return original(*args, **kwargs)
        setattr(owner, name, counted)

    def codec(self, codes, *args, **kwargs):  # codes (rows, 16, frames)
        counts["codec_calls"] += 1
        codec_seen.add((codes.shape[0], codes.shape[-1]))
        counts["codec_call_shapes"] = len(codec_seen)

    def fixed_codec(self):  # a fixed-shape call (accelerators; replayed when graphed): (rows bucket, frames)
        counts["codec_calls"] += 1
        codec_seen.add((self.rows, self.frames))
        counts["codec_call_shapes"] = len(codec_seen)

    def prefill(self, start, prompts):
        counts["prefills"] += len(prompts)
        counts["prefills_padded"] += sum(self.bucket(p.shape[0]) is not None for p in prompts)
        prompt_seen.update(p.shape[0] for p in prompts)
        counts["prefill_lengths"] = len(prompt_seen)

    wrap(StreamingCodec, "step", codec)
    wrap(_Call, "run", fixed_codec)
    wrap(Prefills, "run", prefill)
    return counts


def write_cprofile(profiler, path: Path) -> None:
    """cProfile's top functions, by own time and by cumulative time, to `path`."""
    import io
    import pstats

    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(60)
    path.write_text(text.getvalue())


def attention_kernel(tts, device: str) -> str:
    """The attention kernels one eager frame runs, from profiler op names: "flash", "efficient", "cudnn",
    "math" (CUDA sdpa backends) or the NPU's fused kernels; "unknown" where no profiler names them."""
    if device not in ("cuda", "npu"):
        return "unknown"
    import torch

    from omnitts.device import get_backend
    from omnitts.engine import Engine, EngineConfig
    from omnitts.request import Request

    eng = Engine(tts.ckpt, EngineConfig(max_num_seqs=2, max_positions=512, device=device),
                 backend=get_backend(device, eager=True))
    for i in range(2):
        eng.add(tts.prompts.build(Request(f"Line {i} of the attention probe.", speaker=SPEAKERS[i])),
                tts.default_params(True, max_frames=8), tag=i)
    for _ in range(3):
        eng.step()
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        eng.step()
        getattr(torch, device).synchronize()
    names = [event.key for event in prof.key_averages()]
    for _ in eng.run():
        pass
    return classify_attention(names)


def sdp_enabled() -> str:
    """The sdpa backends torch may pick on CUDA (torch.backends.cuda flags), e.g. "flash,efficient,math,cudnn"."""
    import torch

    flags = torch.backends.cuda
    checks = (("flash", "flash_sdp_enabled"), ("efficient", "mem_efficient_sdp_enabled"),
              ("math", "math_sdp_enabled"), ("cudnn", "cudnn_sdp_enabled"))
    return ",".join(name for name, check in checks if getattr(flags, check, lambda: False)())


def classify_attention(names) -> str:
    """Comma-joined kernel kinds named by profiler `names` (sdpa's dispatch names its backend), or "unknown"."""
    found = []
    for name in names:
        low = name.lower()
        if "attention" not in low and "flash" not in low:
            continue
        for needle, kind in ATTENTION_OPS:
            if needle in low and kind not in found:
                found.append(kind)
    return ",".join(found) or "unknown"


def peak_memory(device: str) -> tuple[float, str]:
    """(GiB, what it is): the device allocator's peak, or the process's peak RSS on the CPU."""
    import torch

    if device in ("cuda", "npu"):
        return getattr(torch, device).max_memory_allocated() / 2**30, f"torch.{device}.max_memory_allocated"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30, "ru_maxrss"


def sync_debug_module(device: str):
    """torch.cuda, or torch.npu when torch_npu has `set_sync_debug_mode` (torch_npu >= 2.5); else None."""
    import torch

    module = getattr(torch, device, None) if device in ("cuda", "npu") else None
    return module if module is not None and hasattr(module, "set_sync_debug_mode") else None


class SyncWatch:
    """Host syncs under the device's sync debug mode, on from the end of the load to the end of the run.

    Off inside `Engine._collect` (the one allowed wait). Graph capture (`GraphSteps._capture`) is one-time
    work that synchronizes by design (torch.cuda.graph does, around its warm-ups): off there in "error"
    mode; in "warn" mode its syncs are listed under "capture: ". In "warn" mode each sync is counted by
    the innermost omnitts line on the Python stack when it happened."""

    def __init__(self, module, mode: str):
        import collections
        import warnings

        self.module, self.mode, self.phase, self.active = module, mode, "", False
        self.sites = collections.Counter()
        if mode == "warn":
            warnings.simplefilter("always")
            shown = warnings.showwarning

            def show(message, category, filename, lineno, file=None, line=None):
                text = str(message).lower()  # not the mode's own notice ("... is a prototype feature ...")
                if "synchroniz" in text and "prototype feature" not in text:
                    self.sites[self.phase + self.site()] += 1
                else:
                    shown(message, category, filename, lineno, file, line)
            warnings.showwarning = show

    @staticmethod
    def site() -> str:
        import traceback

        for frame in reversed(traceback.extract_stack()):
            path = Path(frame.filename)
            if "omnitts" in path.parts and path.name != Path(__file__).name:
                inner = path.parts[len(path.parts) - 1 - path.parts[::-1].index("omnitts"):]
                return f"{'/'.join(inner)}:{frame.lineno} ({frame.name})"
        return "(outside omnitts)"

    def on(self) -> None:
        self.active = True
        self.module.set_sync_debug_mode(self.mode)

    def off(self) -> None:
        self.module.set_sync_debug_mode(0)

    def stop(self) -> None:
        """The run is over: off for good (an allowed call made later does not turn it back on)."""
        self.active = False
        self.off()

    def allow(self, owner, attribute: str, phase: str | None = None) -> None:
        """`owner.attribute` runs with the mode off (`phase` None), or with its syncs listed under `phase`."""
        original = getattr(owner, attribute)
        watch = self

        def allowed(*args, **kwargs):
            if phase is None or watch.mode == "error":
                watch.off()
            watch.phase = phase or ""
            try:
                return original(*args, **kwargs)
            finally:
                watch.phase = ""
                if watch.active:
                    watch.on()
        setattr(owner, attribute, allowed)


def sync_verdict(syncs: SyncWatch | None, errors: list) -> str:
    if syncs is None:
        return "skipped: no set_sync_debug_mode on this device (torch_npu < 2.5, or the CPU)"
    if syncs.mode == "warn":
        outside = sum(n for site, n in syncs.sites.items() if not site.startswith("capture: "))
        return f"{outside} host syncs outside Engine._collect and capture ({len(syncs.sites)} sites)"
    return (f"{len(errors)} items failed on a host sync outside Engine._collect" if errors
            else "0 host syncs outside Engine._collect")


def null_backend():
    """The CPU fake of device graphs whose graphs do nothing: no warm-up, no capture run, no replay work."""
    from omnitts.device.accelerator import Graph
    from omnitts.device.fake import FakeGraphBackend

    class Nothing:
        replays = 0

        def replay(self) -> None:
            self.replays += 1

    class NullBackend(FakeGraphBackend):
        def capture(self, fn, pool, restore, output, inputs=None):
            return Graph(Nothing())
    return NullBackend


def child(spec: dict) -> int:
    """Run `omnitts synth` in this process with timers; write the report to spec["report"]."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    import omnitts.api as api
    from bench_lib import frame_bytes
    from omnitts import cli
    from omnitts.batch.outdir import Batch
    from omnitts.device.base import CallGraphs, GraphSteps
    from omnitts.engine.engine import Engine
    from omnitts.io.audio import AudioSink
    from omnitts.models.codec_streams import CodecStreams, Samples

    device = spec["device"]
    accelerator = device in ("cuda", "npu")
    profile = Path(spec["profile"]) if spec.get("profile") else None
    if profile is not None:
        import torch

        import cProfile

        profile.mkdir(parents=True, exist_ok=True)
        profiler = cProfile.Profile()
        kernels = KernelWindow(device, profile / f"kernels-{spec['preset']}-{spec['max_batch']}.txt")
    timers = Timers(sync=getattr(torch, device).synchronize if profile is not None and accelerator else None)
    seen = {"first_frame_at": None, "first_audio_at": None, "loaded_at": None, "imported_at": time.time(),
            "first_step_at": None, "capture_before_first_frame": None, "steps": 0, "frames": 0,
            "kv_positions_read": 0, "audio_s": 0.0, "errors": [], "tts": None}
    module = sync_debug_module(device) if spec["sync_debug"] else None
    syncs = SyncWatch(module, spec["sync_debug"]) if module is not None else None

    def stepped(finished, args):
        seen["steps"] += 1
        if profile is not None:
            profiler.disable()  # the torch profiler's own work is not the run's
            kernels.step(seen["steps"])
            profiler.enable()
        if seen["first_frame_at"] is None and (finished or any(s.frames for s in args[0].scheduler.running)):
            seen["first_frame_at"] = time.time()
            seen["capture_before_first_frame"] = round(timers.totals.get("capture", 0.0), 3)
        for seq in finished:  # K/V positions read: a frame at position P + t attends over P + t positions
            frames, prompt = len(seq.frames), seq.prompt.embeds.shape[0]
            seen["frames"] += frames
            seen["kv_positions_read"] += frames * prompt + frames * (frames - 1) // 2

    def saved(record, args):
        if record["status"] == "ok":
            seen["audio_s"] += record["seconds"] or 0.0
            seen["first_audio_at"] = seen["first_audio_at"] or time.time()
        else:
            seen["errors"].append(f"{record['id']}: {record['error']}")

    def loaded(tts, args):
        seen["tts"], seen["loaded_at"] = tts, time.time()
        if syncs is not None:
            syncs.on()

    timers.wrap(api, "load", "load", after=loaded)
    timers.wrap(GraphSteps, "_capture", "capture")  # a bucket's warm-up and capture, when a frame first needs it
    timers.wrap(CallGraphs, "capture", "capture")  # a codec call shape's or prefill bucket's warm-up and capture
    timers.wrap(Engine, "step", "engine", after=stepped)
    first_step = Engine.step

    def step(self):
        seen["first_step_at"] = seen["first_step_at"] or time.time()
        return first_step(self)
    Engine.step = step  # outside the timer: when the first step starts (load and the first prompts done)
    timers.wrap(CodecStreams, "pump_later", "codec")  # the pipeline's call: queues a chunk's decode
    timers.wrap(Samples, "result", "codec")  # ... and waits for its audio, a step later
    timers.wrap(CodecStreams, "close", "codec")
    timers.wrap(api.TTS, "prepare", "prepare")
    timers.wrap(AudioSink, "write", "write")
    timers.wrap(Batch, "save", "write", after=saved)
    shapes = count_shapes()
    if spec.get("fake_graphs") or spec.get("null_device"):
        import omnitts.engine.engine as engine_module
        from omnitts.device.fake import FakeGraphBackend

        import omnitts.engine.pipeline as pipeline_module

        backend = null_backend() if spec.get("null_device") else FakeGraphBackend
        if spec.get("null_device"):
            os.environ["OMNITTS_PREFILL_GRAPHS"] = "1"  # prefills as a bfloat16 GPU run makes them: replays
        engine_module.get_backend = lambda name, eager=False: backend(check_trace=False)
        pipeline_module.get_backend = engine_module.get_backend  # the codec's calls too
    if syncs is not None:
        syncs.allow(Engine, "_collect")  # the one allowed wait
        syncs.allow(GraphSteps, "_capture", "capture: ")
        syncs.allow(CallGraphs, "capture", "capture: ")

    argv = ["synth", spec["manifest"], "-m", spec["ckpt"], "-o", spec["out"], "--device", device,
            "--dtype", spec["dtype"], "--max-batch", str(spec["max_batch"]), "-q"]
    if spec.get("deterministic"):
        argv.append("--deterministic")
    if profile is not None:
        profiler.enable()
    started = time.perf_counter()
    try:
        code = cli.app(argv, standalone_mode=False)
    except SystemExit as exc:
        code = exc.code
    finally:
        if syncs is not None:
            syncs.stop()
        if profile is not None:
            profiler.disable()
            write_cprofile(profiler, profile / f"cprofile-{spec['preset']}-{spec['max_batch']}.txt")
            kernels.close()
    if device in ("cuda", "npu"):
        import torch

        getattr(torch, device).synchronize()
    wall, ended_at = time.perf_counter() - started, time.time()
    split = {name: timers.totals.get(name, 0.0) for name in ("load", "capture", "engine", "codec", "prepare", "write")}
    split["host"] = wall - sum(split.values())
    tts = seen["tts"]
    peak, kind = peak_memory(device)
    report = {"preset": spec["preset"], "max_batch": spec["max_batch"], "exit_code": code or 0,
              "wall_s": round(wall, 3), "audio_s": round(seen["audio_s"], 3),
              "audio_s_per_s": round(seen["audio_s"] / wall, 3), "steps": seen["steps"], "frames": seen["frames"],
              "capture_s": round(split["capture"], 3), "split_s": {k: round(v, 4) for k, v in split.items()},
              "background_s": {k: round(v, 4) for k, v in timers.background.items()},
              "peak_memory_gib": round(peak, 3), "peak_memory_kind": kind, "errors": seen["errors"],
              "first_frame_at": seen["first_frame_at"], "first_audio_at": seen["first_audio_at"],
              "loaded_at": seen["loaded_at"], "imported_at": seen["imported_at"], "first_step_at": seen["first_step_at"],
              "capture_before_first_frame_s": seen["capture_before_first_frame"],
              "kv_positions_read": seen["kv_positions_read"], "shapes": shapes}
    if spec.get("null_device"):  # the steps' wall, every timer but load's (and capture's, nothing here)
        report["host_ms_per_step"] = round(1000 * (wall - split["load"]) / max(seen["steps"], 1), 3)
    steady = (ended_at - seen["first_frame_at"]) if seen["first_frame_at"] else None
    report["steady_audio_s_per_s"] = round(seen["audio_s"] / steady, 3) if steady else 0.0
    if spec["sync_debug"]:
        report["sync_debug"] = sync_verdict(syncs, seen["errors"])
        report["sync_sites"] = dict(syncs.sites.most_common(30)) if syncs is not None else {}
    if tts is not None:
        talker = tts.ckpt.config.talker
        report["weight_bytes_per_frame"] = frame_bytes(tts)["total"]
        report["kv_bytes_per_position"] = (2 * talker.num_hidden_layers * talker.num_key_value_heads
                                           * talker.head_dim * tts.ckpt.cache_dtype.itemsize)
        report["attention"] = attention_kernel(tts, device) if spec["attention"] else "(probed in the first run)"
        if device == "cuda":
            report["sdp_enabled"] = sdp_enabled()
    else:
        report.update(weight_bytes_per_frame=0, kv_bytes_per_position=0, attention="unknown")
    Path(spec["report"]).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
