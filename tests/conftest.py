"""Shared fixtures: tiny random checkpoints in the published layout, built once per test session."""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from omnitts.testing.checkpoint import build_checkpoint


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the README's test command): a worker per core this process may use, at most 8 and one per
    3 GiB of memory. Every test computes on one torch thread (`_one_torch_thread`), so a 2-core machine runs
    two tests at once; each worker builds the session's checkpoints for itself and holds ~1.5 GB."""
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        memory = 24 << 30
    return max(1, min(len(usable), 8, memory // (3 << 30)))


def pytest_configure(config):
    """Under `-n`, before the workers start: OpenMP threads that wait for work sleep (`OMP_WAIT_POLICY=PASSIVE`)
    instead of spinning. The tests that run two torch threads (row invariance across threads, ...) spun
    against each other and the other workers' tests on two shared cores: each ran 4-7x longer than alone."""
    if getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_modifyitems(items):
    """tests/test_ray.py's tests share a local Ray cluster (a module fixture) and start more from the CLI:
    under `-n`, `--dist loadgroup` (pyproject's addopts) keeps them on one worker, one cluster at a time."""
    for item in items:
        if item.path.name == "test_ray.py":
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(scope="session", autouse=True)
def _float32_auto_dtype():
    """`--dtype auto` resolves from the CPU's flags; tests see a CPU without native bf16, so `auto`
    means float32 on every machine and equality checks (CLI vs API, batched vs alone) stay exact.
    Session-wide and set up before any other fixture, so module- and session-scoped models see it
    too (those also name their dtype). tests/test_dtype_auto.py sets the flags it needs itself, and
    covers what `auto` picks on a bf16 CPU on purpose."""
    from omnitts.device import features

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(features, "cpu_flags", lambda: frozenset())
        yield


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """One torch thread for the whole session: on two shared cores, two threads made a busy machine
    run test_codec_stream.py 18x longer. Tests of threading set two themselves
    (`_seeded_and_single_threaded` puts one back after them). Processes the tests start (the CLI, the
    official package) get one thread too, through OMP_NUM_THREADS."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seeded_and_single_threaded():
    """Per test: the global generators seeded (a test's random inputs, and so its tolerance checks, do not
    depend on which tests ran before it); afterwards one thread again if the test changed it."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory):
    """Factory: ckpt_dir(kind, preset="tiny-0.6b", eos_scale=0.0) -> path (cached for the session)."""
    root = tmp_path_factory.mktemp("ckpts")
    built = {}

    def get(kind: str, preset: str = "tiny-0.6b", eos_scale: float = 0.0):
        key = (kind, preset, eos_scale)
        if key not in built:
            built[key] = build_checkpoint(root / f"{kind}-{preset}-{eos_scale}", kind=kind, preset=preset,
                                          eos_scale=eos_scale)
        return built[key]

    return get


@pytest.fixture(scope="session")
def tts_factory(ckpt_dir):
    import omnitts

    loaded = {}

    def get(kind: str, preset: str = "tiny-0.6b", eos_scale: float = 0.0, **kwargs):
        # float32 unless asked: equality checks (batched vs alone, engine vs reference) are exact
        # only in float32, and `auto` would pick another dtype on another CPU.
        kwargs.setdefault("dtype", "float32")
        key = (kind, preset, eos_scale, tuple(sorted(kwargs.items())))
        if key not in loaded:
            loaded[key] = omnitts.load(ckpt_dir(kind, preset, eos_scale), **kwargs)
        return loaded[key]

    return get


@pytest.fixture(scope="session")
def ref_wav(tmp_path_factory):
    """A 2 s, 22.05 kHz stereo reference clip (exercises resampling and channel mixing)."""
    path = tmp_path_factory.mktemp("audio") / "ref.wav"
    t = np.arange(int(22050 * 2.0)) / 22050
    left = 0.3 * np.sin(2 * np.pi * 200 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    right = 0.25 * np.sin(2 * np.pi * 330 * t)
    sf.write(path, np.stack([left, right], axis=1).astype(np.float32), 22050)
    return path


@pytest.fixture(scope="session")
def load_script():
    """`load_script(name)`: scripts/<name>.py imported as a module (the scripts are not a package)."""
    scripts = Path(__file__).resolve().parent.parent / "scripts"

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
