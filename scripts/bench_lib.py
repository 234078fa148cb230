"""Helpers of scripts/bench.py: workload, machine figures, child processes, fits and the markdown table.

Owns everything bench.py measures with except its main(): the manifest and its texts, CPU flags and
load, streaming bandwidth and matmul peaks, the bytes and FLOPs one frame step needs, omnitts'
in-process steady-state timings, and the runs of the official package (scripts/reference_runner.py)
and of vox-tts (scripts/vox_runner.py) in their own venvs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
FRAME_SECONDS = 1920 / 24000
SPEAKERS = ["ryan", "vivian", "serena", "aiden"]
WORDS = ("the quick brown fox jumps over a lazy dog while seven bright stars shine above quiet "
         "rivers and distant mountains under a calm evening sky").split()
VOX_PIN = "vox-tts==0.19.5"
VOX_DTYPE = {"float32": "f32", "bfloat16": "bf16"}
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16",
             "amx_int8", "amx_tile", "amx_fp16")


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# -- the workload ---------------------------------------------------------------------------------
def texts(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(6, 16)))).capitalize() + "." for _ in range(n)]


def budgets(n: int, low: int, high: int) -> list[int]:
    values = np.linspace(low, high, n).round().astype(int)
    np.random.default_rng(1).shuffle(values)
    return [int(v) for v in values]


def manifest_items(n: int, low: int, high: int) -> list[dict]:
    """The benchmark manifest: id, text, speaker, frames (the frame budget every item runs to)."""
    return [{"id": f"item{i:03d}", "text": t, "speaker": SPEAKERS[i % len(SPEAKERS)], "frames": f}
            for i, (t, f) in enumerate(zip(texts(n), budgets(n, low, high)))]


def write_manifest(items: list[dict], path: Path) -> None:
    """JSONL for `omnitts synth`; max_seconds = frames / 12.5 gives exactly `frames` frames."""
    with open(path, "w") as f:
        for it in items:
            f.write(json.dumps({"id": it["id"], "text": it["text"], "language": "english", "speaker": it["speaker"],
                                "max_seconds": it["frames"] * FRAME_SECONDS}) + "\n")


def warm_page_cache(folder: Path) -> float:
    """Read every file under `folder` once, so start-up timings see a warm page cache; returns bytes read."""
    total = 0
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()) if Path(folder).is_dir() else [Path(folder)]:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(64 << 20):
                total += len(chunk)
    return total


# -- the machine ----------------------------------------------------------------------------------
def uptime() -> str:
    """`uptime` (its load averages say whether the machine was quiet)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "load average: " + Path("/proc/loadavg").read_text().strip()


def cpu_info() -> dict:
    """The machine as omnitts sees it: flags masked by OMNITTS_CPU_PROFILE, so `auto` resolves as omnitts' does."""
    from omnitts.device import features

    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    have = features.cpu_flags()
    return {"model": model.group(1).strip() if model else "?", "profile": features.cpu_profile(),
            "flags": [f for f in CPU_FLAGS if f in have],
            "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "linear_kernels": linear_kernels()}


def linear_kernels() -> dict:
    """Which kernel omnitts' packed CPU linears use per dtype: its own (native) or oneDNN's."""
    from omnitts.device import native

    kinds = {name: "native" if native.available(dtype) else "oneDNN"
             for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))}
    if native.amx():
        kinds["bfloat16"] = "native (AMX)"
    return kinds


def resolve_dtype(name: str, flags: list[str]) -> str:
    """`auto`: bfloat16 where the CPU has native bf16 (avx512_bf16 or AMX), else float32 (as omnitts' --dtype auto)."""
    if name != "auto":
        return name
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "float32"


def best_of(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def bandwidth(nbytes: int, repeats: int = 5) -> dict:
    """Streaming bandwidth in GB/s: a copy (bytes read + written) and a sum (bytes read)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    copy = best_of(lambda: dst.copy_(src), repeats)
    read = best_of(lambda: src.sum(), repeats)
    return {"bytes": nbytes, "copy_gbs": 2 * nbytes / copy / 1e9, "read_gbs": nbytes / read / 1e9}


def matmul_peak(size: int, dtype: torch.dtype, repeats: int = 3) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    return 2 * size**3 / best_of(lambda: torch.mm(a, b), repeats) / 1e9


def _bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters() if p.dim() == 2)


def frame_bytes(tts) -> dict:
    """Weight bytes one batch-1 frame must read: the talker's layers once, the code predictor's layers
    once per predictor pass (15), the 15 residual lm_heads, and codec_head (embedding rows are negligible)."""
    talker = tts.ckpt.model.talker
    predictor = talker.code_predictor
    passes = predictor.cfg.num_code_groups - 1
    talker_b = _bytes(talker.model.layers) + _bytes(talker.model.norm)
    pred_b = _bytes(predictor.model.layers) + _bytes(predictor.model.norm) + _bytes(predictor.small_to_mtp_projection)
    heads_b = sum(_bytes(h) for h in predictor.lm_head[:passes])
    head_b = _bytes(talker.codec_head)
    return {"talker": talker_b, "predictor_per_pass": pred_b, "predictor_passes": passes, "lm_heads": heads_b,
            "codec_head": head_b, "total": talker_b + passes * pred_b + heads_b + head_b}


def frame_flops(tts, batch: int) -> float:
    """Matmul FLOPs of one frame step for `batch` rows (2 x weights touched per row), attention excluded.

    The predictor's first pass runs two positions (talker hidden + codebook-0 embedding), then one per
    step: 16 row-passes through its layers and its heads (each head on every position, as officially).
    """
    talker = tts.ckpt.model.talker
    predictor = talker.code_predictor
    row_passes = predictor.cfg.num_code_groups
    per_row = _count(talker.model.layers) + _count(talker.codec_head) + row_passes * (
        _count(predictor.model.layers) + _count(predictor.small_to_mtp_projection) + _count(predictor.lm_head[0]))
    return 2.0 * per_row * batch


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares wall = a + b * frames over (frames, wall) points; returns (a, b)."""
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


# -- omnitts, in process ------------------------------------------------------------------------
def omnitts_batch1(tts, text: str, frames: tuple[int, int], warm: int, repeats: int = 2) -> dict:
    """Generation + streamed codec decode of one request at two budgets, warm; slope = ms per frame.
    Each budget runs `repeats` times and keeps its fastest wall (as `vox_runs` does for vox)."""
    from omnitts.request import Request

    def wall(n: int) -> float:
        job = (Request(text, "english", "ryan", id="b1"), tts.default_params(True, max_frames=n))
        started = time.perf_counter()
        for _ in tts.generate([job]):
            pass
        return time.perf_counter() - started

    wall(warm)
    walls = [(f, min(wall(f) for _ in range(repeats))) for f in frames]
    a, b = fit_line(walls)
    return {"walls": walls, "ms_per_frame": 1000 * b, "item_overhead_s": a}


def _warm_engine(tts, batch: int, prompts_text: list[str], warm: int, timed: int):
    """An engine with `batch` requests admitted, `warm` steps run and `timed` + 2 frames of budget left."""
    from omnitts.engine import Engine, plan
    from omnitts.request import Request

    prompts = [tts.prepare(Request(prompts_text[i % len(prompts_text)], "english", SPEAKERS[i % len(SPEAKERS)],
                                   id=str(i))) for i in range(batch)]
    params = tts.default_params(True, max_frames=warm + timed + 2)
    positions = max(p.embeds.shape[0] for p in prompts) + params.max_frames + 1
    config = plan(tts.ckpt, positions, batch, max(p.trailing.shape[0] for p in prompts), tts.kv_budget_bytes)
    if config.max_num_seqs != batch:
        raise RuntimeError(f"the cache budget gives {config.max_num_seqs} slots, not {batch}")
    engine = Engine(tts.ckpt, config)
    for prompt in prompts:
        engine.add(prompt, params)
    for _ in range(warm):  # the first step admits every request (batched prefill) and runs frame 1
        engine.step()
    return engine


def omnitts_steps(tts, batch: int, prompts_text: list[str], warm: int, timed: int, rounds: int = 3) -> float:
    """Seconds per engine step (one frame for `batch` rows; generation only, no codec), warm: the median
    over `rounds` rounds of `timed` steps each (one round of four float32 batch-1 steps once read 147 ms
    in a slow stretch of this VM, where the same run's paired steps' median was 107)."""
    engine = _warm_engine(tts, batch, prompts_text, warm, timed * rounds)
    per_round = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(timed):
            engine.step()
        engine.pending[0].result()  # the round's last frame's codes are on the host
        per_round.append((time.perf_counter() - started) / timed)
    return statistics.median(per_round)


def roofline_pairs(tts, prompts_text: list[str], warm: int, timed: int, nbytes: int) -> dict:
    """Batch-1 engine steps alternated with a read-bandwidth probe (a sum over `nbytes`), so each step is
    judged against the bandwidth of its own moment: this VM's streaming rate moves between runs and
    minutes (25-50 GB/s measured) far more than the kernels do. Each step waits for its codes on the
    host (no overlap with the next). Returns the medians and the median of the per-pair fractions."""
    weights = frame_bytes(tts)["total"]
    src = torch.ones(nbytes // 4)
    src.sum()
    engine = _warm_engine(tts, 1, prompts_text, warm, timed)
    steps, reads, fractions = [], [], []
    for _ in range(timed):
        started = time.perf_counter()
        engine.step()
        engine.pending[0].result()
        steps.append(time.perf_counter() - started)
        started = time.perf_counter()
        src.sum()
        reads.append(nbytes / (time.perf_counter() - started) / 1e9)
        fractions.append(weights / steps[-1] / (reads[-1] * 1e9))
    return {"ms_per_step": 1000 * statistics.median(steps), "read_gbs": statistics.median(reads),
            "fraction": statistics.median(fractions), "pairs": timed}


# -- child processes ----------------------------------------------------------------------------
def child_env() -> dict:
    """Children import this checkout's omnitts, whatever the shared environment points at."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def timed_run(cmd: list, env: dict | None = None, timeout: float | None = None) -> tuple[float, float, str]:
    """Run `cmd`; return (time.time() just before Popen, wall seconds to exit, stdout). Fails loudly."""
    started = time.time()
    proc = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.time() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))[:300]} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return started, wall, proc.stdout


def first_frame(ckpt: Path, dtype: str, text: str, repeats: int = 2) -> dict:
    """Process start to the first frame's codes, `repeats` fresh processes in a row: the fastest one's
    breakdown, with every total in `totals` (the checkpoint is on a warm page cache for all of them)."""
    runs = []
    for _ in range(repeats):
        started, wall, out = timed_run([sys.executable, SCRIPTS / "bench_probe.py", "first-frame", ckpt, dtype,
                                        text, "ryan"], child_env())
        s = json.loads(out.strip().splitlines()[-1])
        runs.append({"python_start": s["t_top"] - started, "imports": s["t_imports"] - s["t_top"],
                     "load": s["t_load"] - s["t_imports"], "first_frame": s["t_first"] - s["t_load"],
                     "total": s["t_first"] - started, "process_wall": wall})
    return {**min(runs, key=lambda r: r["total"]), "totals": [r["total"] for r in runs]}


def omnitts_synth(manifest: Path, ckpt: Path, out: Path, batch: int, dtype: str, items: list[dict],
                  codec_dtype: str = "float32") -> dict:
    """`omnitts synth MANIFEST -m CKPT -o OUT --greedy --max-batch N --dtype D --codec-dtype C --quiet`,
    start to exit."""
    shutil.rmtree(out, ignore_errors=True)  # a second run into the same folder would only skip
    stamps = out.parent / f"{out.name}.stamps.json"
    env = {**child_env(), "OMNITTS_BENCH_STAMPS": str(stamps)}
    _, wall, _ = timed_run([sys.executable, SCRIPTS / "bench_probe.py", "synth", manifest, "-m", ckpt, "-o", out,
                            "--greedy", "--max-batch", batch, "--dtype", dtype, "--codec-dtype", codec_dtype,
                            "--quiet"], env)
    s = json.loads(stamps.read_text())
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    frames = sum(r["frames"] for r in rows if r["status"] == "ok")
    want = sum(it["frames"] for it in items)
    if frames != want or len(rows) != len(items):
        raise RuntimeError(f"omnitts synth made {frames} frames in {len(rows)} items; expected {want} in {len(items)}")
    return {"whole": wall, "startup": s["t_load"] - s["t_top"], "after_load": s["t_end"] - s["t_load"],
            "frames": frames}


def ensure_reference_venv(venv: Path) -> Path:
    # its progress lines go to stderr: stdout carries only the report
    subprocess.run([sys.executable, SCRIPTS / "reference_env.py", "--venv", str(venv)], check=True, stdout=sys.stderr)
    return venv / "bin" / "python"


def official_runs(python: Path, ckpt: Path, dtype: str, items: list[dict], sample: int, frames: tuple[int, int],
                  static: int, warm: int, work: Path) -> dict:
    """One runner process: warm-up, `sample` items one by one at two budgets, warm-up batch, one static
    batch of the first `static` items at two budgets. Both passes are linear in frames, so each is fit as
    wall = a + b * frames and extrapolated to the whole manifest."""
    def case(name, chunk, n):
        many = len(chunk) > 1
        return {"name": name, "mode": "custom_voice", "language": "English",
                "text": [c["text"] for c in chunk] if many else chunk[0]["text"],
                "speaker": [c["speaker"] for c in chunk] if many else chunk[0]["speaker"], "max_new_tokens": n + 1}

    head = items[:static]
    cases = [case("warm1", items[:1], warm)]
    cases += [case(f"one{i}_{f}", [items[i]], f) for i in range(sample) for f in frames]
    cases += [case("warm_static", head, warm)] + [case(f"static_{f}", head, f) for f in frames]
    spec, out = work / f"official-{dtype}.json", work / f"official-{dtype}"
    shutil.rmtree(out, ignore_errors=True)
    spec.write_text(json.dumps({"checkpoint": str(ckpt), "dtype": dtype, "cases": cases}))
    _, wall, _ = timed_run([python, SCRIPTS / "reference_runner.py", spec, out])
    summary = json.loads((out / "summary.json").read_text())["cases"]
    for c in cases:  # the random checkpoints never end early; a run that did would skew the fit
        want = (c["max_new_tokens"] - 1) * (len(c["text"]) if isinstance(c["text"], list) else 1)
        if summary[c["name"]]["frames"] != want:
            raise RuntimeError(f"official {c['name']}: {summary[c['name']]['frames']} frames, expected {want}")
    one = fit_line([(f, summary[f"one{i}_{f}"]["wall_seconds"]) for i in range(sample) for f in frames])
    batch = fit_line([(f, summary[f"static_{f}"]["wall_seconds"]) for f in frames])
    chunks = [items[i:i + static] for i in range(0, len(items), static)]
    one_wall = sum(one[0] + one[1] * it["frames"] for it in items)
    static_wall = sum(batch[0] + batch[1] * max(it["frames"] for it in c) for c in chunks)
    startup = wall - sum(row["wall_seconds"] for row in summary.values())
    return {"process_wall": wall, "startup": startup, "load": summary["warm1"]["load_seconds"],
            "one_fit": one, "static_fit": batch, "ms_per_frame": 1000 * one[1], "sample_items": sample,
            "sample_frames": list(frames), "static_batch": static,
            "one_by_one": {"steady": one_wall, "whole": startup + one_wall},
            "static": {"steady": static_wall, "whole": startup + static_wall}}


# -- vox-tts, a native peer ---------------------------------------------------------------------
def ensure_vox_venv(venv: Path) -> Path:
    """A venv with vox-tts alone (its converter and engine need only numpy); a marker makes reruns instant."""
    marker = venv / ".omnitts-vox-ok"
    python = venv / "bin" / "python"
    if marker.exists() and marker.read_text().strip() == VOX_PIN:
        return python
    if venv.exists() and not (venv / "pyvenv.cfg").exists():
        raise RuntimeError(f"{venv} exists and is not a venv; remove it or pass another --vox-venv")
    shutil.rmtree(venv, ignore_errors=True)
    say(f"creating {venv} with {VOX_PIN}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-qq", "--disable-pip-version-check", VOX_PIN], check=True)
    subprocess.run([str(python), "-c", "import vox; print('vox', vox.__version__)"], check=True)
    marker.write_text(VOX_PIN)
    return python


def vox_model(python: Path, ckpt: Path, dtype: str, work: Path) -> tuple[Path, float]:
    """`python -m vox build --model CKPT --dtype f32|bf16` once per checkpoint and dtype (cached)."""
    tmod = work / f"vox-{ckpt.name}-{VOX_DTYPE[dtype]}.tmod"
    if tmod.exists():
        return tmod, 0.0
    partial = tmod.with_suffix(".partial.tmod")
    started = time.time()
    subprocess.run([str(python), "-m", "vox", "build", "--model", str(ckpt), "--dtype", VOX_DTYPE[dtype],
                    "--no-hash", "-o", str(partial)], check=True, capture_output=True)
    partial.rename(tmod)
    return tmod, time.time() - started


def vox_run(python: Path, spec: dict, path: Path) -> tuple[float, float, dict]:
    path.write_text(json.dumps(spec))
    result = path.with_suffix(".out.json")
    started, wall, _ = timed_run([python, SCRIPTS / "vox_runner.py", path, result])
    return started, wall, json.loads(result.read_text())


def vox_runs(python: Path, tmod: Path, dtype: str, items: list[dict], frames: tuple[int, int], warm: int,
             concurrent: int, work: Path, repeats: int = 2) -> dict:
    """Batch 1 warm (slope over two budgets, each run `repeats` times, fastest kept: this VM is noisy),
    then `concurrent` manifest items at once as a whole process."""
    text = items[0]["text"]
    _, _, single = vox_run(python, {"tmod": str(tmod), "warmup_frames": warm,
                                    "single": [{"text": text, "speaker": "ryan", "frames": f}
                                               for f in frames for _ in range(repeats)]},
                           work / f"vox-{dtype}-single.json")
    for row in single["single"]:
        if row["made_frames"] != row["frames"]:
            raise RuntimeError(f"vox made {row['made_frames']} frames for a budget of {row['frames']}")
    a, b = fit_line([(f, min(r["wall"] for r in single["single"] if r["frames"] == f)) for f in frames])
    chunk = items[:concurrent]
    started, wall, many = vox_run(python, {"tmod": str(tmod), "items": chunk, "concurrency": concurrent},
                                  work / f"vox-{dtype}-items.json")
    if many["items"]["made_frames"] != many["items"]["frames"]:
        raise RuntimeError(f"vox made {many['items']['made_frames']} frames of {many['items']['frames']}")
    audio = many["items"]["frames"] * FRAME_SECONDS
    return {"ms_per_frame": 1000 * b, "item_overhead_s": a, "threads": single.get("threads"),
            "items": len(chunk), "audio_seconds": audio,
            "startup": many["t_load"] - started, "steady": many["items"]["wall"], "whole": wall,
            "rtf_steady": audio / many["items"]["wall"], "rtf_whole": audio / wall}


# -- the report ---------------------------------------------------------------------------------
def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"


def times(ours, theirs, lower_is_better: bool) -> str:
    """'0.94× the time' for durations, '2.7×' for throughputs; — when either side is missing."""
    if ours is None or theirs is None or not theirs:
        return "—"
    ratio = ours / theirs
    return f"{ratio:.2f}× the time" if lower_is_better else f"{ratio:.2f}×"


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return "\n".join(lines)
