"""Benchmark omnitts against the official qwen-tts 0.1.1 (and, with --peers, vox-tts) in one run on this CPU.

Everything runs on the same random CustomVoice checkpoint with the real 0.6B shapes (its EOS row is
zeroed, so every item runs to its frame budget and all engines do the same work), the same texts,
greedy, in float32 and in the auto dtype (bfloat16 where the CPU has native bf16, else float32).

  machine    CPU model and flags, torch's CPU capability, threads, load average at start and end;
             streaming bandwidth (1 GiB copy, read+write; sum, read) and torch.mm peaks (2048^3, 4096^3)
  start-up   process start to the first generated frame (omnitts.load + engine), warm page cache
  batch 1    ms per frame (generation + codec decode, the slope between two budgets, warm) for omnitts,
             the official package and vox; omnitts' engine step alone at batch 1 and each max batch,
             against the roofline (weight bytes per frame / read bandwidth) and the matmul peak
  manifest   --items lines with frame budgets spread over [--min-frames, --max-frames]:
             omnitts: `omnitts synth MANIFEST -m CKPT -o OUT --greedy --max-batch N --dtype D --quiet`
               as a child process per max batch: whole process (start to exit) and steady state
               (the same process after its checkpoint load returned);
             official one by one and in static batches of 8 (a batch runs to its longest item): both
               are linear in frames, so they are measured on a sample after a warm-up (--official-sample
               items at the two --sample-frames budgets; one batch at both) and extrapolated;
               whole process = the runner's own start-up + the extrapolated pass;
             vox (--peers): the first --vox-items items at once, whole process and after load;
             --codec-bf16: for bfloat16, omnitts also with `--codec-dtype bfloat16` (batch 1 and the
               manifest), the official package's own bfloat16 setting (its codec runs in the model dtype).
             × realtime = seconds of audio (only the requested frames) per wall-clock second.

    python scripts/bench.py [--peers] [--json results.json]     # the full benchmark (see docs/performance.md)
    python scripts/bench.py --quick --peers                     # tiny shapes, end to end in minutes

Needs the reference venv (built here by scripts/reference_env.py if missing); --peers builds
.cache/vox-venv with vox-tts 0.19.5 and converts the checkpoint with `python -m vox build`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_lib as lib  # noqa: E402

QUICK = dict(preset="tiny-0.6b", items=8, min_frames=4, max_frames=12, batches="2,4", sample_frames="4,12",
             warm_frames=2, step_frames=3, pair_steps=3, official_sample=1, copy_mib=64, mm_sizes="256,512")
FULL = dict(preset="0.6b", items=64, min_frames=20, max_frames=200, batches="8,16,32,64", sample_frames="10,30",
            warm_frames=3, step_frames=4, pair_steps=9, official_sample=2, copy_mib=1024,
            mm_sizes="2048,4096")


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few frames: a smoke test")
    parser.add_argument("--peers", action="store_true", help="also time vox-tts (its own venv)")
    parser.add_argument("--work", type=Path, default=lib.ROOT / ".cache" / "bench")
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("OMNITTS_REF_VENV",
                                                                          lib.ROOT / ".cache" / "ref-venv")))
    parser.add_argument("--vox-venv", type=Path, default=lib.ROOT / ".cache" / "vox-venv")
    parser.add_argument("--dtypes", default="float32,auto", help="float32, bfloat16 and/or auto")
    parser.add_argument("--manifest-dtypes", help="dtypes of the omnitts manifest runs (default: --dtypes)")
    parser.add_argument("--codec-bf16", action="store_true",
                        help="bfloat16: also run omnitts with a bfloat16 codec (batch 1 and the manifest)")
    parser.add_argument("--preset", help="checkpoint shapes (0.6b; --quick: tiny-0.6b)")
    parser.add_argument("--items", type=int, help="manifest lines (64)")
    parser.add_argument("--min-frames", type=int, help="shortest item's frame budget (20)")
    parser.add_argument("--max-frames", type=int, help="longest item's frame budget (200)")
    parser.add_argument("--batches", help="omnitts max batch sizes (8,16,32,64)")
    parser.add_argument("--sample-frames", help="the two budgets of the batch-1 and official samples (10,30)")
    parser.add_argument("--warm-frames", type=int, help="frames of each warm-up run (3)")
    parser.add_argument("--step-frames", type=int, help="timed engine steps per batch size (4)")
    parser.add_argument("--pair-steps", type=int,
                        help="batch-1 engine steps each followed by a bandwidth probe, for the roofline (9)")
    parser.add_argument("--official-sample", type=int, help="items of the official one-by-one sample (2)")
    parser.add_argument("--static-batch", type=int, default=8, help="the official static batch size")
    parser.add_argument("--vox-items", type=int, default=8, help="manifest items vox runs at once")
    parser.add_argument("--copy-mib", type=int, help="tensor size of the bandwidth test (1024)")
    parser.add_argument("--mm-sizes", help="torch.mm sizes of the peak test (2048,4096)")
    parser.add_argument("--json", type=Path, help="also write every figure here (updated after each phase)")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.sample_frames = tuple(int(f) for f in args.sample_frames.split(","))
    if len(args.sample_frames) != 2 or args.sample_frames[0] >= args.sample_frames[1]:
        parser.error("--sample-frames takes two increasing budgets, e.g. 10,30")
    args.mm_sizes = [int(s) for s in args.mm_sizes.split(",")]
    return args


def main(argv=None) -> int:
    args = parse(argv)
    import omnitts
    from omnitts.testing.checkpoint import build_checkpoint

    bench_started = time.time()
    machine = lib.cpu_info()
    machine["uptime_start"] = lib.uptime()
    results: dict = {"machine": machine, "args": {k: (str(v) if isinstance(v, Path) else v)
                                                  for k, v in vars(args).items()}, "dtypes": {}, "phases": {}}

    def save():
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))

    def phase(name, started):
        results["phases"][name] = round(time.time() - started, 1)
        lib.say(f"{name}: {results['phases'][name]:.0f} s (bench at {time.time() - bench_started:.0f} s)")
        save()

    # Setup: checkpoint, manifest, venvs (not timed as part of any measurement).
    started = time.time()
    args.work.mkdir(parents=True, exist_ok=True)
    ckpt = args.work / f"custom_voice-{args.preset}"
    if not (ckpt / "model.safetensors").exists():
        lib.say(f"building a random {args.preset} CustomVoice checkpoint in {ckpt}")
        build_checkpoint(ckpt, kind="custom_voice", preset=args.preset, dtype="bfloat16")
    items = lib.manifest_items(args.items, args.min_frames, args.max_frames)
    manifest = args.work / f"manifest-{args.items}x{args.min_frames}-{args.max_frames}.jsonl"
    lib.write_manifest(items, manifest)
    audio = sum(it["frames"] for it in items) * lib.FRAME_SECONDS
    results["manifest"] = {"path": str(manifest), "items": len(items), "frames": sum(it["frames"] for it in items),
                           "audio_seconds": audio}
    ref_python = lib.ensure_reference_venv(args.venv)
    vox_python = lib.ensure_vox_venv(args.vox_venv) if args.peers else None
    dtypes: dict[str, str] = {}  # label -> resolved; auto resolving to a dtype already listed is run once
    for name in args.dtypes.split(","):
        resolved = lib.resolve_dtype(name, machine["flags"])
        label = f"auto → {resolved}" if name == "auto" else name
        if resolved not in dtypes.values():
            dtypes[label] = resolved
    manifest_dtypes = {lib.resolve_dtype(n, machine["flags"]) for n in (args.manifest_dtypes or args.dtypes).split(",")}
    results["checkpoint_bytes"] = lib.warm_page_cache(ckpt)
    phase("setup", started)

    # Machine figures.
    started = time.time()
    machine["bandwidth"] = lib.bandwidth(args.copy_mib << 20)
    machine["matmul_gflops"] = {f"{dt}_{size}": lib.matmul_peak(size, getattr(torch, dt))
                                for dt in ("float32", "bfloat16") for size in args.mm_sizes}
    phase("machine", started)

    def codec_bf16(dtype: str) -> bool:
        return args.codec_bf16 and dtype == "bfloat16"

    text0 = items[0]["text"]
    for label, dtype in dtypes.items():
        r = results["dtypes"][label] = {"dtype": dtype}
        started = time.time()
        r["first_frame"] = lib.first_frame(ckpt, dtype, text0)
        phase(f"{label}: start-up to first frame", started)

        started = time.time()
        steps = {}
        # Loaded as each user would: max batch 1 for batch 1 (CPU weights get the batch-1 layout,
        # see omnitts/device/cpu_weights.py), the largest max batch for the batched steps.
        for max_batch, batches in ((1, [1]), (max(args.batches), sorted(set(args.batches) - {1}))):
            tts = omnitts.load(ckpt, dtype=dtype, max_batch=max_batch)
            if max_batch == 1:
                r["frame_bytes"] = lib.frame_bytes(tts)
                r["omnitts_batch1"] = lib.omnitts_batch1(tts, text0, args.sample_frames, args.warm_frames)
                r["roofline_pairs"] = lib.roofline_pairs(tts, [text0], args.warm_frames, args.pair_steps,
                                                         args.copy_mib << 20)
            for batch in batches:
                seconds = lib.omnitts_steps(tts, batch, [it["text"] for it in items], args.warm_frames,
                                            args.step_frames)
                steps[batch] = {"ms_per_step": 1000 * seconds, "gflops": lib.frame_flops(tts, batch) / seconds / 1e9}
            del tts
            gc.collect()
        if codec_bf16(dtype):  # batch 1 again, decoded by a bfloat16 codec (engine steps are the same)
            tts = omnitts.load(ckpt, dtype=dtype, max_batch=1, codec_dtype="bfloat16")
            r["omnitts_batch1_codec_bf16"] = lib.omnitts_batch1(tts, text0, args.sample_frames, args.warm_frames)
            del tts
            gc.collect()
        r["omnitts_steps"] = dict(sorted(steps.items()))
        phase(f"{label}: omnitts in process", started)

        started = time.time()
        r["official"] = lib.official_runs(ref_python, ckpt, dtype, items, args.official_sample, args.sample_frames,
                                          args.static_batch, args.warm_frames, args.work)
        phase(f"{label}: official sample", started)

        if vox_python is not None:
            started = time.time()
            tmod, build_seconds = lib.vox_model(vox_python, ckpt, dtype, args.work)
            lib.warm_page_cache(tmod)
            r["vox"] = lib.vox_runs(vox_python, tmod, dtype, items, args.sample_frames, args.warm_frames,
                                    args.vox_items, args.work)
            r["vox"]["build_seconds"] = build_seconds
            phase(f"{label}: vox", started)

    try:  # the long part last: Ctrl-C here still reports everything measured so far
        for label, dtype in dtypes.items():
            if dtype not in manifest_dtypes:
                continue
            r = results["dtypes"][label]
            r["omnitts_manifest"] = {}
            for batch in args.batches:
                started = time.time()
                r["omnitts_manifest"][batch] = lib.omnitts_synth(
                    manifest, ckpt, args.work / f"synth-{dtype}-{batch}", batch, dtype, items)
                phase(f"{label}: omnitts synth, max batch {batch}", started)
            if codec_bf16(dtype):
                r["omnitts_manifest_codec_bf16"] = {}
                for batch in args.batches:
                    started = time.time()
                    r["omnitts_manifest_codec_bf16"][batch] = lib.omnitts_synth(
                        manifest, ckpt, args.work / f"synth-{dtype}-codec-bf16-{batch}", batch, dtype, items,
                        codec_dtype="bfloat16")
                    phase(f"{label}: omnitts synth, bfloat16 codec, max batch {batch}", started)
    except KeyboardInterrupt:
        lib.say("interrupted: the report below has the manifest runs that finished")
        results["interrupted"] = True

    machine["uptime_end"] = lib.uptime()
    results["bench_seconds"] = round(time.time() - bench_started, 1)
    save()
    print(report(results, args))
    return 0


def report(results: dict, args) -> str:
    """The markdown tables: per dtype, then start-up, roofline and the machine."""
    m, audio = results["machine"], results["manifest"]["audio_seconds"]
    f1, f2 = args.sample_frames
    n = results["manifest"]["items"]
    out = [f"## omnitts vs official qwen-tts 0.1.1{' vs vox-tts 0.19.5' if args.peers else ''}: "
           f"{args.preset} shapes, greedy, {n} items of {args.min_frames}–{args.max_frames} frames "
           f"({audio:.0f} s of audio)", ""]
    for label, r in results["dtypes"].items():
        off, vox = r["official"], r.get("vox")
        plural = "s" if off["sample_items"] > 1 else ""
        sample = f"extrapolated from {off['sample_items']} item{plural} at {f1} and {f2} frames"
        one_batch = f"extrapolated from 1 batch of {off['static_batch']} at {f1} and {f2} frames"
        vox_ms = vox and vox["ms_per_frame"]
        rows = []
        for key, what in (("omnitts_batch1", f"generation + decode, {f1}→{f2} frames, warm"),
                          ("omnitts_batch1_codec_bf16", "omnitts with a bfloat16 codec")):
            if key in r:
                ours = r[key]["ms_per_frame"]
                rows.append([f"batch 1, ms per frame ({what})", off["ms_per_frame"], ours, vox_ms,
                             lib.times(ours, off["ms_per_frame"], True), lib.times(ours, vox_ms, True)])
        rows += [
                ["batch 1, ms per engine step (generation only)", None, r["omnitts_steps"][1]["ms_per_step"], None,
                 "", ""],
                ["start-up to first frame, s", None, r["first_frame"]["total"], None, "", ""]]
        for kind, what in (("steady", "steady state"), ("whole", "whole process")):
            rows.append([f"one by one, × realtime, {what} ({sample})", audio / off["one_by_one"][kind],
                         None, None, "", ""])
            rows.append([f"static batches of {off['static_batch']}, × realtime, {what} ({one_batch})",
                         audio / off["static"][kind], None, None, "", ""])
            if vox:
                rows.append([f"vox: {vox['items']} items at once, × realtime, {what}", None, None,
                             vox[f"rtf_{kind}"], "", ""])
            for key, codec in (("omnitts_manifest", ""), ("omnitts_manifest_codec_bf16", ", bfloat16 codec")):
                for batch, run in r.get(key, {}).items():
                    rtf = audio / (run["after_load"] if kind == "steady" else run["whole"])
                    vs_off = (f"{lib.times(rtf, audio / off['one_by_one'][kind], False)} one-by-one, "
                              f"{lib.times(rtf, audio / off['static'][kind], False)} static")
                    rows.append([f"omnitts max batch {batch}{codec}, × realtime, {what}", None, rtf, None, vs_off,
                                 lib.times(rtf, vox and vox[f"rtf_{kind}"], False)])
        out += [f"### {label}", "", lib.table(["measurement", "official", "omnitts", "vox", "omnitts vs official",
                                                "omnitts vs vox"], rows), ""]
    out += ["Steady state: official = its per-case walls after load; omnitts manifest = the `omnitts synth` "
            "process after its checkpoint load returned; batch 1 = warm, in process. Whole process = start "
            "to exit (official: its runner's start-up + the extrapolated pass). omnitts vs vox compares the "
            "manifest's × realtime with vox's on its first items (a sample of the same mix).", ""]
    out += ["### Start-up to first frame (s, warm page cache; the fastest of the probes)", "",
            lib.table(["dtype", "python start", "imports", "load", "first frame", "total"],
                      [[label, f["python_start"], f["imports"], f["load"], f["first_frame"],
                        f"{f['total']:.2f} (of {', '.join(f'{t:.2f}' for t in f.get('totals', [f['total']]))})"]
                       for label, f in ((lb, r["first_frame"]) for lb, r in results["dtypes"].items())]), ""]
    bw = m["bandwidth"]
    rows = []
    for label, r in results["dtypes"].items():
        fb, steps, pairs = r["frame_bytes"], r["omnitts_steps"], r["roofline_pairs"]
        roof = 1000 * fb["total"] / (bw["read_gbs"] * 1e9)
        peak = max(v for k, v in m["matmul_gflops"].items() if k.startswith(r["dtype"]))
        big = [b for b in steps if b >= 32] or [max(steps)]
        rows.append([label, fb["total"] / 1e6, roof, steps[1]["ms_per_step"], f"{roof / steps[1]['ms_per_step']:.0%}",
                     f"{pairs['ms_per_step']:.1f} ms, {pairs['read_gbs']:.1f} GB/s: {pairs['fraction']:.0%}",
                     ", ".join(f"b{b}: {steps[b]['gflops']:.1f} ({steps[b]['gflops'] / peak:.0%})" for b in big)])
    out += ["### Roofline (omnitts engine steps, generation only)", "",
            lib.table(["dtype", "MB read per batch-1 frame", "roofline ms (MB / read GB/s at start)", "measured ms",
                       "of roofline", "paired (each step then a read probe; medians)", "GFLOP/s (of matmul peak)"],
                      rows), ""]
    profile = m.get("profile", "native")  # OMNITTS_CPU_PROFILE: this CPU posing as a lesser one
    posing = f" (as OMNITTS_CPU_PROFILE={profile})" if profile != "native" else ""
    out += ["### Machine", "", lib.table(["", ""], [
        ["CPU", m["model"]], ["flags", (" ".join(m["flags"]) or "none of interest") + posing],
        ["torch CPU capability", f"{m['torch_capability']} (torch {m['torch']})"],
        ["threads", f"{m['torch_threads']} torch of {m['logical_cpus']} logical CPUs"],
        ["omnitts linear kernel", ", ".join(f"{k} {v}" for k, v in m.get("linear_kernels", {}).items())],
        ["bandwidth", f"copy {bw['copy_gbs']:.1f} GB/s (read+write), sum {bw['read_gbs']:.1f} GB/s (read), "
                      f"{bw['bytes'] >> 20} MiB"],
        ["matmul peak", ", ".join(f"{k.replace('_', ' ')}^3: {v:.0f}" for k, v in m["matmul_gflops"].items())
         + " GFLOP/s"],
        ["load at start", m["uptime_start"]], ["load at end", m["uptime_end"]],
        ["bench wall", f"{results['bench_seconds'] / 60:.1f} min"]]), ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
