"""Create the virtual environment that runs the official qwen-tts 0.1.1 for parity tests.

The official package pins its own dependency set (transformers==4.57.3, accelerate==1.12.0, gradio,
...), which must not leak into omnitts' environment, so it lives in a venv of its own, driven by
scripts/reference_runner.py. Every package is pinned. qwen-tts goes in
with --no-deps: its metadata also asks for gradio, sox, onnxruntime and torchaudio, which only its
demo and its 25 Hz tokenizer use; the runner stubs the three that are imported at import time.

    python scripts/reference_env.py [--venv PATH] [--python PYTHON]

PATH defaults to $OMNITTS_REF_VENV, else .cache/ref-venv under the repository root. A marker file
written after a successful smoke test makes a second run instant; change a pin and it rebuilds.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = ".omnitts-reference-ok"
TORCH = "torch==2.13.0"  # the CPU build on this machine's disk; see cpu_torch_or_exit
OFFICIAL = "qwen-tts==0.1.1"
PINS = [
    TORCH,
    "transformers==4.57.3",  # what qwen-tts 0.1.1 requires
    "accelerate==1.12.0",  # what qwen-tts 0.1.1 requires; device_map="cpu" needs it
    "librosa==0.11.0",  # mel filters of the speaker encoder, audio loading and resampling
    "soundfile==0.14.0",
    "einops==0.8.2",  # imported by the 25 Hz tokenizer at import time
    "numpy==2.4.6",
    # Everything those pull in, pinned so that every run resolves to the same set.
    "tokenizers==0.22.2", "huggingface_hub==0.36.2", "safetensors==0.8.0", "regex==2026.11.15",
    "PyYAML==6.0.3", "packaging==26.3", "requests==2.34.2", "tqdm==4.70.1", "filelock==4.2.11",
    "fsspec==2026.9.0", "hf-xet==1.8.0", "psutil==7.2.2", "typing_extensions==4.16.0", "sympy==1.14.0",
    "mpmath==1.3.0", "networkx==3.6.1", "Jinja2==3.1.6", "MarkupSafe==3.0.4", "setuptools==84.2.1",
    "scipy==1.17.1", "scikit-learn==1.9.1", "joblib==1.6.0", "threadpoolctl==3.8.0", "narwhals==2.29.0",
    "numba==0.68.1", "llvmlite==0.50.0", "audioread==3.1.0", "decorator==5.3.1", "lazy-loader==0.6",
    "msgpack==1.2.4", "pooch==1.9.0", "platformdirs==4.14.7", "soxr==1.1.0", "cffi==2.1.1",
    "pycparser==3.12", "certifi==2026.10.18", "charset-normalizer==3.5.2", "idna==3.20", "urllib3==2.8.0",
    "cloudpickle==3.1.2",
]


def say(message: str) -> None:
    print(f"reference_env: {message}", flush=True)


# pip as the caller's environment has it, less the caller's constraints: PINS are the official package's
# exact set, and a constraint meant for omnitts' own venv (CI's oldest stack sets PIP_CONSTRAINT) conflicts.
PIP_ENV = {k: v for k, v in os.environ.items() if k != "PIP_CONSTRAINT"}


def run(cmd: list[str], what: str) -> None:
    say(f"{what}: {' '.join(cmd)}")
    started = time.time()
    if subprocess.run(cmd, env=PIP_ENV).returncode != 0:
        sys.exit(f"reference_env: {what} failed (command above); fix the cause and re-run this script")
    say(f"{what}: done in {time.time() - started:.0f} s")


def wanted(python: str) -> dict:
    """What the marker records; any difference means the venv is rebuilt."""
    try:
        version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"reference_env: cannot run --python {python}: {exc}")
    return {"python": version, "pins": PINS, "official": OFFICIAL}


def is_ready(marker: Path, want: dict) -> bool:
    try:
        return json.loads(marker.read_text()) == want
    except (OSError, ValueError):
        return False


def prepare_folder(venv: Path) -> None:
    """Only ever wipe a folder that is a venv (or empty): the path may have been mistyped."""
    if venv.exists() and any(venv.iterdir()) and not (venv / "pyvenv.cfg").exists():
        sys.exit(f"reference_env: {venv} exists and is not a virtual environment; "
                 "remove it or pass another --venv")
    if venv.exists():
        say(f"removing the incomplete or outdated venv at {venv}")
        shutil.rmtree(venv)


def cpu_torch_or_exit(pip: str) -> None:
    """Refuse to let pip fall back to PyPI's torch, which is a multi-GB CUDA build."""
    out = subprocess.run([pip, "install", "--dry-run", "--quiet", "--no-deps", "--report", "-", TORCH],
                         capture_output=True, text=True, env=PIP_ENV)
    chosen = json.loads(out.stdout)["install"] if out.returncode == 0 and out.stdout.strip() else []
    if not chosen or "+cpu" not in chosen[0]["metadata"]["version"]:
        found = chosen[0]["download_info"]["url"] if chosen else out.stderr.strip()[-300:]
        sys.exit(f"reference_env: pip offers no CPU build for {TORCH} with this Python (it found: {found}); "
                 "run this script with the Python the local torch wheel is built for (--python python3.11)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = os.environ.get("OMNITTS_REF_VENV") or ROOT / ".cache" / "ref-venv"
    parser.add_argument("--venv", type=Path, default=Path(default), help="where to create it")
    parser.add_argument("--python", default=sys.executable, help="interpreter to base the venv on")
    args = parser.parse_args(argv)
    venv = args.venv.resolve()
    want = wanted(args.python)
    # One builder at a time: parallel test workers (pytest -n) each ask for the venv; the others wait here,
    # then find it ready.
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build(venv, want, args.python)


def build(venv: Path, want: dict, base_python: str) -> int:
    """Make the venv at `venv` from `base_python` unless its marker already records `want`."""
    marker = venv / MARKER
    if is_ready(marker, want):
        say(f"ready at {venv}")
        return 0

    started = time.time()
    prepare_folder(venv)
    run([base_python, "-m", "venv", str(venv)], "creating the venv")
    python, pip = str(venv / "bin" / "python"), str(venv / "bin" / "pip")
    # -qq: errors only (this machine's pip config adds an index that warns once per package)
    pip_flags = ["-qq", "--progress-bar", "off", "--disable-pip-version-check"]
    cpu_torch_or_exit(pip)
    run([pip, "install", *pip_flags, *PINS], f"installing {len(PINS)} pinned packages")
    run([pip, "install", *pip_flags, "--no-deps", OFFICIAL], f"installing {OFFICIAL} without its dependencies")
    run([python, str(ROOT / "scripts" / "reference_runner.py"), "--check"], "smoke test (import qwen_tts)")
    marker.write_text(json.dumps(want, indent=1))
    say(f"ready at {venv} after {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
