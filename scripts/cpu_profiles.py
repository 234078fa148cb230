"""Run the tests whose outcome depends on the CPU's kernels under every CPU profile, one after another.

    python scripts/cpu_profiles.py                        # the `kernels` tests under each profile
    python scripts/cpu_profiles.py --profiles avx2,no-compiler -- tests/test_engine.py -x
    python scripts/cpu_profiles.py -- -m "not slow"       # the whole default tier under each profile
    python scripts/cpu_profiles.py --logs .cache/ci       # each profile's pytest output in DIR/profile-NAME.log
    python scripts/cpu_profiles.py --rerun                # a failing profile's failed tests once more, alone (CI)
    python scripts/cpu_profiles.py -n 0                   # each profile's tests in one process (default: -n auto)

The profiles (docs/devices.md): `native` (this machine as it is), `avx512` (AVX-512 without bf16), `avx2`
(AVX2 + FMA only), `avx512_bf16` (on request: AVX-512 with bf16, no AMX), `native-off` (OMNITTS_NATIVE=0)
and `no-compiler` (CXX names no compiler, with an empty cache). The CPU classes are OMNITTS_CPU_PROFILE
with torch's matching ATEN_CPU_CAPABILITY, both set before pytest starts; a class this CPU lacks is
skipped with the reason. Without pytest arguments each profile runs the default tier's tests marked
`kernels` (pyproject.toml: parity, batch invariance, the native kernels, the engine against its slow path,
streamed codec against whole, ...), a third of the tier in a third of its time; arguments after `--` replace
that selection. Each profile's run spreads its tests over pytest-xdist workers (`-n auto`, as the README's
test command: one per core; `-n 0` runs them in one process). Prints each profile's time and pytest summary, and a failing profile's failures
(pytest's tracebacks and FAILED lines: CI's log shows them); exits 1 if any profile failed. With `--rerun`
a failing profile's failed tests run once more on their own: those that pass then are printed as FLAKY, by
name, at the end, and do not fail the profile; any that fail again do.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT = ("native", "avx512", "avx2", "native-off", "no-compiler")
KERNEL_TESTS = ["-m", "kernels and not slow"]  # the selection without pytest arguments
SWITCHES = ("OMNITTS_CPU_PROFILE", "ATEN_CPU_CAPABILITY", "OMNITTS_NATIVE", "OMNITTS_NATIVE_MARCH", "CXX")


def profile_environment(name: str, scratch: Path) -> dict[str, str] | str:
    """The variables that make a process run as profile `name`, or why this CPU cannot."""
    from omnitts.device import features

    if name == "native-off":
        return {"OMNITTS_NATIVE": "0"}
    if name == "no-compiler":  # an empty cache: a library built earlier would otherwise load
        return {"CXX": "/nonexistent/c++", "OMNITTS_CACHE_DIR": str(scratch / "no-compiler-cache")}
    if name not in features.PROFILES:
        sys.exit(f"cpu_profiles: unknown profile {name!r}; choose from {', '.join([*features.PROFILES, *DEFAULT])}")
    missing = [flag for flag in features.PROFILES[name].needs if flag not in features._detected_flags()]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    return features.profile_environment(name)


def run(name: str, env: dict[str, str], pytest_args: list[str], logs: Path | None,
        suffix: str = "") -> tuple[int, float, str, list[str]]:
    """pytest under one profile: (exit status, seconds, its closing summary line, its output's lines)."""
    base = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
    began = time.monotonic()
    done = subprocess.run(command, check=False, cwd=ROOT, env={**base, **env}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    seconds = time.monotonic() - began
    if logs is not None:
        try:
            (logs / f"profile-{name}{suffix}.log").write_text(done.stdout, encoding="utf-8")
        except OSError as error:  # a full disk: the run's verdict still counts, and is printed below
            print(f"cpu_profiles: {name:<12} could not write its log: {error.strerror} ({error.filename})", flush=True)
    lines = done.stdout.strip().splitlines()
    return done.returncode, seconds, lines[-1] if lines else "", lines


def verdicts(lines: list[str]) -> list[str]:
    """pytest's one line per failed test: `FAILED tests/x.py::test_y[p] - why` (or `ERROR ...`)."""
    return [line for line in lines if line.startswith(("FAILED ", "ERROR "))]


def failed_ids(lines: list[str]) -> list[str]:
    """The test ids those lines name."""
    return [words[1] for words in map(str.split, verdicts(lines)) if len(words) > 1 and "::" in words[1]]


def free_space() -> str:
    """The free space where a run writes (the checkout, and the temporary folder for tmp_path): a full disk
    fails tests in ways that read like bugs."""
    places = dict.fromkeys((str(ROOT), tempfile.gettempdir()))  # each once, in this order
    return ", ".join(f"{shutil.disk_usage(place).free / 2**30:.1f} GiB free in {place}" for place in places)


def failures(lines: list[str], most: int = 150) -> str:
    """What a failing run said about its failures (pytest's FAILURES/ERRORS sections and its FAILED/ERROR lines),
    at most `most` lines from the sections: CI shows it where the profile's log file stays on the CI machine."""
    body, keep = [], False
    for line in lines:
        if line.startswith("=") and ("FAILURES" in line or "ERRORS" in line):
            keep = True
        elif line.startswith("=") and keep:
            keep = False
        if keep:
            body.append(line)
    if len(body) > most:
        body = body[:most // 2] + [f"... ({len(body) - most} lines left out) ..."] + body[-most // 2:]
    return "\n".join(body + verdicts(lines) + [f"disk: {free_space()}"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default=",".join(DEFAULT), help="comma-separated (default: %(default)s)")
    parser.add_argument("--logs", type=Path, help="write each profile's pytest output to DIR/profile-NAME.log")
    parser.add_argument("--rerun", action="store_true",
                        help="run a failing profile's failed tests once more, alone: those that pass then are "
                             "reported as FLAKY by name and do not fail the profile")
    parser.add_argument("-n", "--workers", default="auto",
                        help="pytest-xdist workers per profile run (default: %(default)s; 0: one process)")
    parser.add_argument("pytest_args", nargs="*",
                        help=f"passed to pytest (after --; default: {' '.join(KERNEL_TESTS)})")
    args = parser.parse_args(argv)
    args.pytest_args = args.pytest_args or KERNEL_TESTS
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    failed, flaky, began = [], [], time.monotonic()
    with tempfile.TemporaryDirectory(prefix="omnitts-profiles-") as scratch:
        for name in args.profiles.split(","):
            env = profile_environment(name, Path(scratch))
            if isinstance(env, str):
                print(f"cpu_profiles: {name:<12} skipped: {env}", flush=True)
                continue
            shown = " ".join(f"{k}={v}" for k, v in env.items() if k != "OMNITTS_CACHE_DIR") or "(as is)"
            print(f"cpu_profiles: {name:<12} {shown}", flush=True)
            status, seconds, summary, lines = run(name, env, ["-n", args.workers, *args.pytest_args], args.logs)
            report = failures(lines) if status != 0 else ""
            if report:
                print(report, flush=True)
            print(f"cpu_profiles: {name:<12} {'passed' if status == 0 else 'FAILED'} in {seconds:.0f} s: {summary}",
                  flush=True)
            ids = failed_ids(lines) if status != 0 and args.rerun else []
            if ids:  # once more, those tests alone: a failure that does not come back is named, not hidden
                again, _, summary, lines = run(name, env, ["-n", "0", *ids], args.logs, "-rerun")
                if again == 0:
                    flaky.append(f"{name}: {', '.join(ids)}")
                    status = 0
                else:
                    print(failures(lines), flush=True)
                print(f"cpu_profiles: {name:<12} rerun of its {len(ids)} failed test(s) "
                      f"{'passed: FLAKY, see below' if again == 0 else 'FAILED again'}: {summary}", flush=True)
            if status != 0:
                failed.append(name)
    for line in flaky:
        print(f"cpu_profiles: FLAKY (failed, then passed alone): {line}")
    print(f"cpu_profiles: {len(failed)} profile(s) failed{': ' + ', '.join(failed) if failed else ''}; "
          f"{time.monotonic() - began:.0f} s in all")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
