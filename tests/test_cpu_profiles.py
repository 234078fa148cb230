"""Every CPU profile on one machine: `OMNITTS_CPU_PROFILE` (device/features.py) makes this CPU pose as an
AVX2-only one, an AVX-512 one without bf16 or one with it; `OMNITTS_NATIVE=0` and a missing compiler turn
omnitts' kernels off. Each profile, in a fresh process (torch and the kernel library are chosen once per
process), loads the tiny checkpoint in every `--dtype` and synthesizes through the codec.
scripts/cpu_profiles.py runs the default tier's `kernels` tests under each one (CI does, on its newest stack)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnitts.device import features, native
from omnitts.errors import OmniTTSError

ZEN4 = frozenset({"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl",
                  "avx512_vnni", "avx512_bf16", "avx512_vbmi"})
SAPPHIRE_RAPIDS = ZEN4 | {"amx_tile", "amx_bf16", "amx_int8", "avx512_fp16", "avx_vnni"}
AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma"})
DTYPES = ("auto", "float32", "bfloat16")  # the CLI's --dtype choices on a CPU (float16 is not offered there)
# The kernels off, by switch and for want of a compiler: the profiles beside features.PROFILES.
FALLBACKS = {"native-off": {"OMNITTS_NATIVE": "0"}, "no-compiler": {"CXX": "/nonexistent/c++"}}
ROOT = Path(__file__).resolve().parent.parent
SHIPPED_CPU_FLAGS = features.cpu_flags  # taken at collection, before conftest pins `auto` to float32


@pytest.fixture
def cpu(monkeypatch):
    """cpu(flags, profile): this process poses as a CPU with `flags`, `OMNITTS_CPU_PROFILE=profile`."""
    def pose(flags, profile=None):
        monkeypatch.setattr(features, "_detected_flags", lambda: flags)
        monkeypatch.setattr(features, "cpu_flags", SHIPPED_CPU_FLAGS)
        monkeypatch.delenv("OMNITTS_NATIVE_MARCH", raising=False)
        if profile is None:
            monkeypatch.delenv(features.PROFILE_VARIABLE, raising=False)
        else:
            monkeypatch.setenv(features.PROFILE_VARIABLE, profile)
    return pose


def test_a_profile_masks_the_flags_and_picks_the_kernels_target(cpu, monkeypatch):
    """On a Sapphire Rapids, each profile hides what its class lacks, so `auto` resolves as on such a CPU, and
    builds omnitts' kernels for that class; OMNITTS_NATIVE_MARCH still names the target where given."""
    expected = {"native": ("bfloat16", "native"), "avx512_bf16": ("bfloat16", "cooperlake"),
                "avx512": ("float32", "skylake-avx512"), "avx2": ("float32", "haswell")}
    assert set(expected) == set(features.PROFILES)
    for profile, (auto, march) in expected.items():
        cpu(SAPPHIRE_RAPIDS, profile)
        flags = features.cpu_flags()
        assert features.resolve_dtype("auto", "cpu") == auto, profile
        assert native.flags()[0] == f"-march={march}", profile
        assert ("avx512f" in flags) == (profile != "avx2") and ("amx_bf16" in flags) == (profile == "native")
        assert ("avx512_bf16" in flags) == (profile in ("native", "avx512_bf16")), profile
        assert features.describe()["profile"] == profile
    monkeypatch.setenv("OMNITTS_NATIVE_MARCH", "znver3")
    assert native.flags()[0] == "-march=znver3"
    cpu(SAPPHIRE_RAPIDS, None)
    assert features.cpu_profile() == "native" and features.cpu_flags() == SAPPHIRE_RAPIDS


def test_each_profile_builds_apart():
    """The build cache is keyed by the target, so profiles never share a library."""
    keys = set()
    for profile in features.PROFILES:
        env = {features.PROFILE_VARIABLE: profile}
        with pytest.MonkeyPatch.context() as patch:
            patch.delenv("OMNITTS_NATIVE_MARCH", raising=False)
            patch.setattr(features, "_detected_flags", lambda: SAPPHIRE_RAPIDS)
            for key, value in env.items():
                patch.setenv(key, value)
            keys.add(native._digest())
    assert len(keys) == len(features.PROFILES)


def test_a_bad_or_unrunnable_profile_is_an_error_naming_the_variable(cpu):
    cpu(ZEN4, "avx1024")
    with pytest.raises(OmniTTSError, match="OMNITTS_CPU_PROFILE='avx1024' is not a CPU profile; use one of native"):
        features.cpu_flags()
    cpu(AVX2_ONLY, "avx512")  # a profile poses as a lesser CPU; it cannot add instructions
    with pytest.raises(OmniTTSError, match="OMNITTS_CPU_PROFILE=avx512: this CPU lacks avx512f, avx512cd"):
        features.cpu_profile()
    cpu(AVX2_ONLY, "avx2")
    assert features.cpu_flags() == AVX2_ONLY


_SYNTH_EVERY_DTYPE = """
import json, sys, warnings
warnings.simplefilter("ignore")
import torch, omnitts
from omnitts.device import features, native
got = {"capability": torch.backends.cpu.get_cpu_capability(), "march": features.native_march(),
       "native": [native.available(torch.float32), native.available(torch.bfloat16)],
       "native_bf16": features.native_bf16(), "runs": {}}
for dtype in ("auto", "float32", "bfloat16"):
    tts = omnitts.load(sys.argv[1], dtype=dtype)
    audio = tts.synthesize("Every profile.", speaker="ryan", greedy=True, max_frames=3)
    got["runs"][dtype] = {"dtype": str(tts.ckpt.dtype).split(".")[1],
                          "codec": str(tts.ckpt.codec.pre_conv.conv.weight.dtype).split(".")[1],
                          "frames": audio.frames, "samples": int(audio.samples.shape[0]),
                          "bounded": bool(abs(audio.samples).max() <= 1.0), "sound": bool(abs(audio.samples).max() > 0)}
print(json.dumps(got))
"""


def _environ(**extra) -> dict:
    """This process's environment less every profile switch, plus `extra`."""
    switches = {"OMNITTS_NATIVE", "OMNITTS_NATIVE_MARCH", "OMNITTS_CPU_PROFILE", "ATEN_CPU_CAPABILITY", "CXX"}
    env = {k: v for k, v in os.environ.items() if k not in switches}
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])), **extra}


def _runnable(profile: str) -> bool:
    return all(flag in features._detected_flags() for flag in features.PROFILES[profile].needs)


def test_every_profile_runs_every_dtype_through_the_codec(ckpt_dir, tmp_path):
    """Each profile x dtype (auto, float32, bfloat16): the models load in the dtype `auto` resolves to on such
    a CPU, torch runs the profile's kernel level, and three frames decode to bounded, non-silent audio. One
    process per profile, all started at once (each imports torch and omnitts, and may build its kernels)."""
    folder = str(ckpt_dir("custom_voice"))
    profiles = {name: features.profile_environment(name) for name in features.PROFILES if _runnable(name)}
    profiles.update({name: {**env, "OMNITTS_CACHE_DIR": str(tmp_path / name)} for name, env in FALLBACKS.items()})
    started = {name: subprocess.Popen([sys.executable, "-c", _SYNTH_EVERY_DTYPE, folder], env=_environ(**env),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, env in profiles.items()}
    results = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, f"{name}: {err[-3000:]}"
        results[name] = json.loads(out.strip().splitlines()[-1])
    for name, got in results.items():
        profile = features.PROFILES.get(name, features.PROFILES["native"])
        bf16 = features.native_bf16(features._detected_flags()) and name not in ("avx512", "avx2")
        assert got["native_bf16"] == bf16, (name, got)
        assert set(got["runs"]) == set(DTYPES), (name, got)
        for dtype, run in got["runs"].items():
            want = ("bfloat16" if bf16 else "float32") if dtype == "auto" else dtype
            assert run["dtype"] == want and run["codec"] == "float32", (name, dtype, run)
            assert run["frames"] == 3 and run["samples"] == 3 * 1920 and run["bounded"] and run["sound"], (name, run)
        if profile.aten:
            assert got["capability"] == profile.aten.upper(), (name, got)
        if name in FALLBACKS:
            assert got["native"] == [False, False], (name, got)
        elif _compiler():  # the kernels built for the profile's class: bfloat16 ones only where it has them
            assert got["march"] == (profile.march or "native") and got["native"] == [True, bf16], (name, got)
    assert not list((tmp_path / "no-compiler").glob("native/*/*.so"))
    covered = {(name, dtype) for name, got in results.items() for dtype in got["runs"]}
    wanted = {(name, dtype) for name in [*features.PROFILES, *FALLBACKS] for dtype in DTYPES}
    missing = sorted(wanted - covered)
    assert all(not _runnable(name) for name, _ in missing), f"profile x dtype left uncovered: {missing}"


def _compiler() -> bool:
    """Whether omnitts' kernels can build here (native.build's conditions: a compiler, an x86-64 CPU)."""
    import platform
    import shutil

    return any(shutil.which(c) for c in ("g++", "c++", "clang++")) and platform.machine() in ("x86_64", "AMD64")


# The `omnitts` command as `python -m omnitts` runs it, on a CPU with native bf16: where this one has none,
# its flags gain avx512_bf16 (what `auto` reads), so that every machine runs what a bf16 CPU's user runs.
_OMNITTS_ON_A_BF16_CPU = """
import sys
from omnitts.device import features
flags = features.cpu_flags()
features.cpu_flags = lambda: flags | {"avx512_bf16"}
from omnitts import api
load = api.load
def loaded(*args, **kwargs):  # says which dtype `auto` loaded
    tts = load(*args, **kwargs)
    print("loaded", tts.ckpt.dtype, tts.ckpt.codec.pre_conv.conv.weight.dtype, file=sys.stderr, flush=True)
    return tts
api.load = loaded
sys.argv[0] = "omnitts"
from omnitts.launch import main
main()
"""


def test_the_command_runs_without_native_kernels_on_a_bf16_cpu(ckpt_dir, tmp_path):
    """`OMNITTS_NATIVE=0 omnitts demo`, and `omnitts synth --dtype auto` without a compiler (an empty cache),
    on a bf16 CPU: both exit 0 and write every item (auto is bfloat16 there: the language models load in
    bf16 while the codec stays float32 with every layer on oneDNN and torch). Both processes at once."""
    manifest = tmp_path / "lines.jsonl"
    manifest.write_text('{"id": "a", "text": "No compiler.", "speaker": "ryan"}\n'
                        '{"id": "b", "text": "Still speaks.", "speaker": "vivian"}\n', encoding="utf-8")
    runs = {
        "demo": (["demo", "-o", str(tmp_path / "demo"), "--model-dir", str(tmp_path / "demo-ckpt")],
                 {"OMNITTS_NATIVE": "0"}),
        "synth": (["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "synth"),
                   "--dtype", "auto", "--max-frames", "4"],
                  {"CXX": "/nonexistent/c++", "OMNITTS_CACHE_DIR": str(tmp_path / "cache")}),
    }
    started = {name: subprocess.Popen([sys.executable, "-c", _OMNITTS_ON_A_BF16_CPU, *argv], env=_environ(**env),
                                      cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for name, (argv, env) in runs.items()}
    for name, process in started.items():
        output = process.communicate(timeout=600)[0]
        assert process.returncode == 0, f"{name}: {output[-3000:]}"
        assert "loaded torch.bfloat16 torch.float32" in output, f"{name} did not run bf16 models: {output[-3000:]}"
        records = [json.loads(line) for line in (tmp_path / name / "results.jsonl").read_text().splitlines()]
        assert records and all(r["status"] == "ok" and r["frames"] > 0 for r in records), (name, records)
    assert len(records) == 2 and not list((tmp_path / "cache").glob("native/*/*.so"))


def test_ci_runs_the_kernel_tests_under_every_profile_that_computes_differently(load_script):
    """scripts/cpu_profiles.py's default list holds every CPU class but `avx512_bf16` (`native` on a bf16 CPU
    without AMX; a test above runs it on every machine) and both fallbacks, and .ci/run hands it all of them but
    `native`, the run just before, and `no-compiler`, which computes as `native-off` does (its own behaviour,
    the failed build, is checked in the default tier above), and `avx512_bf16` too where the CPU has AMX (whose
    tiles `native` runs bfloat16 on); a profile added to features.PROFILES must join them. Without pytest arguments the script selects the default tier's `kernels` tests, and that selection
    holds the checks that catch a kernel computing differently: parity, batch invariance, the native
    kernels, the engine against its slow path and the streamed codec against the whole decode."""
    import re

    script = load_script("cpu_profiles")
    assert set(script.DEFAULT) == {*features.PROFILES, *FALLBACKS} - {"avx512_bf16"}
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r'python scripts/cpu_profiles\.py --profiles "\$profiles" --logs \S+ --rerun; fi', ci)
    assert re.search(r'^stack newest \S+ "" "\$profiles"', ci, re.MULTILINE)
    handed = re.search(r'^profiles=(\S+)$', ci, re.MULTILINE).group(1).split(",")
    assert sorted(handed) == sorted(set(script.DEFAULT) - {"native", "no-compiler"})
    # On an AMX CPU `native` runs bfloat16 on AMX tiles: the AVX512-BF16 kernels are then a profile apart.
    assert re.search(r'^if grep -q -w amx_bf16 /proc/cpuinfo 2>/dev/null; then profiles="\$profiles,avx512_bf16"; fi$',
                     ci, re.MULTILINE)
    handed.append("avx512_bf16")
    for name in handed:  # each names a profile the script knows
        assert isinstance(script.profile_environment(name, ROOT), (dict, str))

    assert script.KERNEL_TESTS == ["-m", "kernels and not slow"]
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             *script.KERNEL_TESTS], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = {line.split("::")[0] for line in listed.splitlines() if "::" in line}
    for must in ("test_parity", "test_invariance", "test_native", "test_engine", "test_codec_stream",
                 "test_cpu_weights", "test_cpu_convs", "test_layers"):
        assert f"tests/{must}.py" in files, f"{must} lost its `kernels` mark"
    assert "tests/test_writers.py" not in files  # a selection, not the whole tier
    assert "test_greedy_parity_with_official_package[rest]" not in listed  # slow tests stay out


def test_a_failing_profile_prints_its_failures_and_rerun_names_a_flaky_test(load_script, tmp_path, capsys):
    """CI keeps no profile's log: the failures are printed. With --rerun, a test that fails once and then passes
    alone is named FLAKY and does not fail the profile; one that fails every time still does."""
    script = load_script("cpu_profiles")
    mark = tmp_path / "failed-once"
    suite = tmp_path / "test_probe.py"
    suite.write_text(f"""import pathlib
def test_fails_the_first_time():
    mark = pathlib.Path({str(mark)!r})
    if not mark.exists():
        mark.write_text("x")
        raise AssertionError("the first time")
def test_passes():
    pass
""")
    args = ["--profiles", "native-off", "--rerun", "--", str(suite), "--rootdir", str(tmp_path)]
    with pytest.raises(SystemExit) as done:
        script.main(args)
    out = capsys.readouterr().out
    assert done.value.code == 0 and "AssertionError: the first time" in out
    assert "FLAKY (failed, then passed alone): native-off: " in out and "test_fails_the_first_time" in out
    suite.write_text("def test_fails_every_time():\n    raise AssertionError('every time')\n")
    with pytest.raises(SystemExit) as done:
        script.main(args)
    out = capsys.readouterr().out
    assert done.value.code == 1 and "FAILED again" in out and "1 profile(s) failed: native-off" in out
    assert out.count("AssertionError: every time") >= 2  # the run's failures, then the rerun's
    assert "disk: " in out and " GiB free in " in out  # a full disk fails tests in ways that read like bugs


def test_a_log_that_cannot_be_written_does_not_stop_the_run(load_script, tmp_path, capsys):
    """CI once ran out of disk writing a profile's log, and the script died with a traceback instead of giving
    its verdicts: now it says so and goes on (here a folder stands where the log would go)."""
    script = load_script("cpu_profiles")
    suite = tmp_path / "test_probe.py"
    suite.write_text("def test_passes():\n    pass\n")
    (tmp_path / "logs" / "profile-native-off.log").mkdir(parents=True)
    with pytest.raises(SystemExit) as done:
        script.main(["--profiles", "native-off", "--logs", str(tmp_path / "logs"), "--", str(suite),
                     "--rootdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    assert "native-off   could not write its log: " in out and "native-off   passed in " in out


def test_ci_runs_the_readme_set_up_and_test_commands_as_written():
    """CI calls the README's test command exactly (its set-up, then the fast tier, then the slow tier the README
    names), so a change to one that the other does not follow fails here rather than on a user's machine."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.DOTALL)
    tests = [line for block in blocks for line in block.splitlines() if "python -m pytest" in line]
    assert len(tests) == 1, tests
    setup, command = tests[0].split(" && ")
    assert setup == 'pip install -q torch==2.13.0 -e ".[test]"'
    assert re.search(r'^ +pip install -q "\$torch" -e "\.\[test\]"', ci, re.MULTILINE)
    assert re.search(r'^stack newest torch==2\.13\.0 ', ci, re.MULTILINE)  # the README's torch, on the newest stack
    assert re.search(rf'^ +{re.escape(command)} \| tee ', ci, re.MULTILINE), command
    slow = re.search(r"`(python -m pytest -q -m slow[^`]*)` runs the slow tier", readme).group(1)
    assert slow == f"{command.replace('pytest -q', 'pytest -q -m slow')}"  # the same options, the other tier
    assert re.search(rf'^ +{re.escape(slow)} \| tee ', ci, re.MULTILINE), slow
