"""Parity with the official qwen-tts 0.1.1 package on the same random checkpoints.

Builds tiny checkpoints of every kind in both size shapes (hidden sizes equal with an identity
projection, like 0.6B; a wider talker with a real small_to_mtp_projection, like 1.7B), runs the
official package (in its own venv, scripts/reference_runner.py) and omnitts' reference path with
greedy decoding on the same inputs, and compares: codes must be identical, waveforms within 1e-4.
Also checks that `official_tokenizer=True` reproduces the official token ids on tricky text.

    python scripts/parity.py [--work .cache/parity] [--frames 48] [--cases cv_plain,vd,clone_icl]
    python scripts/parity.py --device cuda --venv VENV     # both packages on a GPU, graphs included

Prints a table (case, frames, identical?, max |Δ|, min greedy margin) and exits 1 on any mismatch.
With `--engine` (the default off the CPU) each case also runs through the batching engine (device
graphs on cuda/npu, then eagerly), alone and with its checkpoint's other cases in one batch, and
those codes must equal the official ones too. Off the CPU, TF32 is turned off in both processes
(NVIDIA_TF32_OVERRIDE=0): float32 parity means float32 arithmetic.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WAV_TOLERANCE = 1e-4

# name -> (kind, preset, eos_scale)
CHECKPOINTS = {
    "cv-0.6b": ("custom_voice", "tiny-0.6b", 0.0),
    "cv-1.7b": ("custom_voice", "tiny-1.7b", 0.0),
    "vd-1.7b": ("voice_design", "tiny-1.7b", 0.0),
    "base-0.6b": ("base", "tiny-0.6b", 0.0),
    "base-1.7b": ("base", "tiny-1.7b", 0.0),
    "cv-0.6b-eos": ("custom_voice", "tiny-0.6b", 3.0),
}

CASES = [
    dict(name="cv_plain", ckpt="cv-0.6b", mode="custom_voice", text="Hello there, this is a plain sentence.",
         language="English", speaker="ryan"),
    dict(name="cv_auto_streaming", ckpt="cv-0.6b", mode="custom_voice", text="Language auto, streaming text mode.",
         language="Auto", speaker="serena", non_streaming_mode=False),
    dict(name="cv_dialect", ckpt="cv-0.6b", mode="custom_voice", text="今天天气很好，我们去公园吧。",
         language="Chinese", speaker="eric"),
    dict(name="cv_dialect_auto", ckpt="cv-1.7b", mode="custom_voice", text="北京的胡同很有意思。",
         language="Auto", speaker="dylan"),
    dict(name="cv_instruct", ckpt="cv-1.7b", mode="custom_voice", text="With an instruction this time.",
         language="English", speaker="vivian", instruct="Speak cheerfully and a little fast."),
    dict(name="cv_plain_1.7b", ckpt="cv-1.7b", mode="custom_voice", text="No instruction on the wide talker.",
         language="English", speaker="aiden"),
    dict(name="vd", ckpt="vd-1.7b", mode="voice_design", text="A described voice speaks these words.",
         language="English", instruct="A warm, low male voice, slow and calm."),
    dict(name="vd_streaming", ckpt="vd-1.7b", mode="voice_design", text="Streaming text mode for voice design.",
         language="Auto", instruct="Bright young female voice.", non_streaming_mode=False),
    dict(name="clone_icl", ckpt="base-0.6b", mode="voice_clone", text="Cloned voice, in-context mode.",
         language="English", ref_text="This is what the reference clip says.", x_vector_only_mode=False),
    dict(name="clone_icl_nonstreaming", ckpt="base-0.6b", mode="voice_clone", text="In-context, non-streaming text.",
         language="English", ref_text="Reference words.", x_vector_only_mode=False, non_streaming_mode=True),
    dict(name="clone_xvec", ckpt="base-0.6b", mode="voice_clone", text="Speaker embedding only.",
         language="Auto", x_vector_only_mode=True),
    dict(name="clone_icl_1.7b", ckpt="base-1.7b", mode="voice_clone", text="Wide talker cloning an iPhone user.",
         language="English", ref_text="The reference for the wide model.", x_vector_only_mode=False),
    dict(name="cv_eos", ckpt="cv-0.6b-eos", mode="custom_voice", text="This one may stop early at EOS.",
         language="English", speaker="ryan", min_frames=1),
]

TOKENIZE_TEXTS = [
    "iPhone and JavaScript users can't stop; I'm sure they'll agree.",
    "CamelCaseWords like McDonald and OpenAI, plus HTTPServer.",
    "Numbers: 2024, 3.14159, 1,000,000 and 42nd.",
    "中文测试：你好，世界！今天是2024年。",
    "日本語のテキストと English mixed 한국어.",
    "  leading spaces and trailing newline\n",
]


def reference_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        sys.exit(f"reference venv not found at {venv}; create it with: python scripts/reference_env.py")
    return python


def build_inputs(work: Path, chosen: list[dict] = CASES) -> dict[str, Path]:
    """The chosen cases' checkpoints and cv-0.6b (the token ids; cached by name) and a reference clip at
    16 kHz stereo (exercises resampling)."""
    import soundfile as sf

    from omnitts.testing.checkpoint import build_checkpoint

    paths = {}
    for name, (kind, preset, eos_scale) in CHECKPOINTS.items():
        if name != "cv-0.6b" and all(c["ckpt"] != name for c in chosen):
            continue
        folder = work / "ckpt" / name
        if not (folder / "model.safetensors").exists():
            build_checkpoint(folder, kind=kind, preset=preset, seed=zlib.crc32(name.encode()) % 1000, eos_scale=eos_scale)
        paths[name] = folder
    ref = work / "ref_16k_stereo.wav"
    if not ref.exists():
        t = np.arange(int(16000 * 2.3)) / 16000
        left = 0.3 * np.sin(2 * np.pi * 180 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 2.5 * t))
        right = 0.2 * np.sin(2 * np.pi * 310 * t + 0.5)
        sf.write(ref, np.stack([left, right], axis=1).astype(np.float32), 16000)
    paths["ref"] = ref
    return paths


def select(names: str | None) -> list[dict]:
    """The CASES named (comma-separated, in CASES' order), or all of them."""
    if not names:
        return CASES
    wanted = set(names.split(","))
    unknown = wanted - {c["name"] for c in CASES}
    if unknown:
        sys.exit(f"parity: unknown case(s) {', '.join(sorted(unknown))}; known: {', '.join(c['name'] for c in CASES)}")
    return [c for c in CASES if c["name"] in wanted]


def run_reference(python: Path, paths: dict, frames: int, work: Path, device: str = "cpu",
                  chosen: list[dict] = CASES) -> Path:
    """Run the official package over the chosen cases (one runner call per checkpoint they use; the token
    ids always, on cv-0.6b)."""
    out = work / f"reference-{device}"
    out.mkdir(parents=True, exist_ok=True)
    for ckpt in CHECKPOINTS:
        cases = [_official_case(c, frames, paths) for c in chosen if c["ckpt"] == ckpt]
        if ckpt == "cv-0.6b":
            cases.append({"name": "tokenize", "mode": "tokenize", "texts": TOKENIZE_TEXTS})
        if not cases:
            continue
        spec = work / f"cases-{ckpt}.json"
        spec.write_text(json.dumps({"checkpoint": str(paths[ckpt]), "dtype": "float32", "device": device,
                                    "cases": cases}, indent=1))
        subprocess.run([str(python), str(ROOT / "scripts" / "reference_runner.py"), str(spec), str(out)], check=True)
    return out


def _official_case(case: dict, frames: int, paths: dict) -> dict:
    spec = {k: v for k, v in case.items() if k not in ("ckpt", "min_frames")}
    spec["max_new_tokens"] = frames + 1  # the official last token never gets a frame
    if case["mode"] == "voice_clone":
        spec["ref_audio"] = str(paths["ref"])
    return spec


def _request(case: dict, paths: dict):
    import omnitts

    return omnitts.Request(
        id=case["name"], text=case["text"], language=case["language"], speaker=case.get("speaker"), instruct=case.get("instruct"),
        ref_audio=paths["ref"] if case["mode"] == "voice_clone" else None, ref_text=case.get("ref_text"),
        x_vector_only=case.get("x_vector_only_mode", False), non_streaming=case.get("non_streaming_mode"))


def _load(paths: dict, ckpt: str, device: str, eager: bool = False):
    import omnitts

    return omnitts.load(paths[ckpt], official_tokenizer=True, dtype="float32", device=device, eager=eager)


def run_omnitts(case: dict, frames: int, paths: dict, device: str = "cpu"):
    tts = _load(paths, case["ckpt"], device)
    return tts.run_reference(_request(case, paths), tts.default_params(greedy=True, max_frames=frames))


def _same(ref_codes: np.ndarray, codes: np.ndarray) -> bool:
    return ref_codes.shape == codes.shape and bool((ref_codes == codes).all())


def _max_abs_diff(ref_wav: np.ndarray, wav: np.ndarray) -> float:
    """Largest sample difference; inf when the lengths differ, 0 for two empty signals."""
    if ref_wav.shape != wav.shape:
        return float("inf")
    return float(np.abs(ref_wav - wav).max()) if wav.size else 0.0


def compare(reference: Path, frames: int, paths: dict, device: str = "cpu",
            chosen: list[dict] = CASES) -> tuple[list[dict], bool]:
    rows, ok = [], True
    for case in chosen:
        ref = np.load(reference / f"{case['name']}.npz")
        started = time.time()
        result = run_omnitts(case, frames, paths, device)
        ref_codes = ref["codes"]
        identical = _same(ref_codes, result.codes)
        delta = _max_abs_diff(ref["wav"], result.audio)
        good = identical and delta <= WAV_TOLERANCE and result.frames >= case.get("min_frames", 40)
        ok &= good
        rows.append(dict(case=case["name"], ckpt=case["ckpt"], frames=result.frames, ref_frames=int(ref_codes.shape[0]),
                         identical=identical, max_abs_diff=delta,
                         margin=min(result.talker_margin, result.predictor_margin), ok=good,
                         seconds=round(time.time() - started, 2)))
        print(f"parity: {case['name']} reference path: identical={identical} max|d|={delta:.2e} "
              f"({rows[-1]['seconds']} s)", flush=True)
    return rows, ok


def compare_engine(reference: Path, frames: int, paths: dict, device: str,
                   chosen: list[dict] = CASES) -> tuple[list[dict], bool]:
    """Each checkpoint's cases through the engine (graphs, then eager): one at a time, then all in one
    batch; every run's codes must equal the official ones, and the audio stay within tolerance."""
    rows, ok = [], True
    for ckpt in CHECKPOINTS:
        cases = [c for c in chosen if c["ckpt"] == ckpt]
        if not cases:
            continue
        refs = {c["name"]: np.load(reference / f"{c['name']}.npz") for c in cases}
        for eager in (False, True) if device != "cpu" else (True,):  # the CPU has no graphs
            started = time.time()
            tts = _load(paths, ckpt, device, eager)
            params = tts.default_params(greedy=True, max_frames=frames)
            alone = {c["name"]: tts.run(_request(c, paths), params) for c in cases}
            together = {a.id: a for a in tts.generate([(_request(c, paths), params) for c in cases])}
            for name, ref in refs.items():
                for mode, result in (("alone", alone[name]), ("batched", together[name])):
                    identical = _same(ref["codes"], result.codes)
                    delta = _max_abs_diff(ref["wav"], result.audio)
                    good = identical and delta <= WAV_TOLERANCE
                    ok &= good
                    rows.append(dict(case=name, run=f"{'eager' if eager else 'graphs'} {mode}", identical=identical,
                                     max_abs_diff=delta, ok=good))
            print(f"parity: {ckpt} engine {'eager' if eager else 'graphs'}: {len(cases)} cases alone and batched, "
                  f"{time.time() - started:.1f} s", flush=True)
    return rows, ok


def compare_tokens(reference: Path, paths: dict) -> tuple[list[dict], bool]:
    from omnitts.text.tokenizer import TextTokenizer

    ref = np.load(reference / "tokenize.npz", allow_pickle=True)
    official = TextTokenizer(paths["cv-0.6b"], official_regex=True)
    native = TextTokenizer(paths["cv-0.6b"])
    rows, ok = [], True
    for i, text in enumerate(TOKENIZE_TEXTS):
        expected = [int(x) for x in ref[f"assistant_ids_{i}"]]
        same = official.assistant_ids(text) == expected
        ok &= same
        rows.append(dict(text=text, official_identical=same, native_differs=native.assistant_ids(text) != expected))
    return rows, ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "parity")
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("OMNITTS_REF_VENV", ROOT / ".cache" / "ref-venv")))
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"], help="where both packages run")
    parser.add_argument("--engine", action=argparse.BooleanOptionalAction, default=None,
                        help="also compare the batching engine (default: on off the CPU)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    args = parser.parse_args(argv)
    chosen = select(args.cases)
    python = reference_python(args.venv)
    if args.device != "cpu":
        os.environ["NVIDIA_TF32_OVERRIDE"] = "0"  # before CUDA starts here, and inherited by the runner
    args.work.mkdir(parents=True, exist_ok=True)
    paths = build_inputs(args.work, chosen)
    reference = run_reference(python, paths, args.frames, args.work, args.device, chosen)
    rows, ok = compare(reference, args.frames, paths, args.device, chosen)
    engine_rows = []
    if args.engine if args.engine is not None else args.device != "cpu":
        engine_rows, engine_ok = compare_engine(reference, args.frames, paths, args.device, chosen)
        ok &= engine_ok
    token_rows, tokens_ok = compare_tokens(reference, paths)
    print(f"{'case':26} {'frames':>6} {'identical':>9} {'max|Δ|':>10} {'min margin':>10}  ok")
    for r in rows:
        print(f"{r['case']:26} {r['frames']:>6} {str(r['identical']):>9} {r['max_abs_diff']:>10.2e} {r['margin']:>10.4f}  {r['ok']}")
    for r in engine_rows:
        print(f"{r['case']:26} {r['run']:>15} {str(r['identical']):>9} {r['max_abs_diff']:>10.2e}  {r['ok']}")
    for r in token_rows:
        print(f"tokens identical={r['official_identical']!s:5} native differs={r['native_differs']!s:5}  {r['text']!r}")
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "cases": rows, "engine": engine_rows, "tokens": token_rows}, indent=1, ensure_ascii=False))
    return 0 if ok and tokens_ok else 1


if __name__ == "__main__":
    sys.exit(main())
