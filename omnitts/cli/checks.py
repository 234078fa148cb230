"""The checks the commands make before anything loads (device, dtypes, output format; synth's devices, Ray
options, retries and the files in OUT it would replace), and where the library's log lines go."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import typer

from ..errors import OmniTTSError
from .options import either, fail, plural


class LogToStderr(logging.Handler):
    """The "omnitts" logger's lines on stderr, as they are (`typer.echo` finds the current stderr)."""

    def emit(self, record: logging.LogRecord) -> None:
        typer.echo(self.format(record), err=True)


LOG_HANDLER = LogToStderr()


def show_log(quiet: bool) -> None:
    """Show the library's INFO notes (such as the one-time kernel build) unless `quiet`; warnings always."""
    logger = logging.getLogger("omnitts")
    if LOG_HANDLER not in logger.handlers:
        logger.addHandler(LOG_HANDLER)
    LOG_HANDLER.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.setLevel(logging.INFO)


def check_engine(engine: dict, devices: str | None = None, recipe: Path | None = None,
                 has_devices: bool = True) -> None:
    """Reject a bad device, dtype or codec dtype (and a device this machine lacks) before anything loads;
    `devices`: the --devices list the device kind came from, named in the error instead of --device; `recipe`:
    the recipe it came from (no --device given), named instead (`--device cuda` was never typed); `has_devices`:
    the command takes --devices (synth), which is how one picks a device by its index."""
    from ..recipe import CODEC_DTYPES, DEVICES, DTYPES, VISIBLE, device_index

    if one := device_index(engine["device"]):  # torch's name of one device ("choose cpu, cuda or npu" said)
        kind, index = one
        how = f"--devices {engine['device']}, or " if has_devices else ""
        fail(f"--device {engine['device']!r}: give the kind, {kind!r}; to run on device {index}: {how}"
             f"{VISIBLE[kind]}={index} before the command with --device {kind}")
    for flag, name, choices in (("--device", "device", DEVICES), ("--dtype", "dtype", DTYPES),
                                ("--codec-dtype", "codec_dtype", CODEC_DTYPES)):
        if engine[name] not in choices:
            fail(f"{flag} {engine[name]!r}: choose {either(choices)}")
    kind = engine["device"]
    given = f"--devices {devices}" if devices else f'{recipe}: device = "{kind}"' if recipe else f"--device {kind}"
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail(f"{given}: no CUDA device is visible to torch "
                 f"({'CPU workers: --devices cpu,cpu' if devices else 'use --device cpu'})")
    elif kind == "npu":
        from ..device.npu import import_torch_npu

        try:
            import_torch_npu(given)
        except OmniTTSError as exc:
            fail(str(exc))


def checkpoint_config(model: Path):
    """The checkpoint's config, and its text tokenizer checked too (files present, its chat tokens defined; a
    cheap build, reused by the load): a bad one is refused before the manifest is read or weights load, in
    validate as in synth. CheckpointError naming the file."""
    from ..config import load_config
    from ..text.tokenizer import TextTokenizer

    cfg = load_config(model)
    TextTokenizer(model)
    return cfg


def names_audio_file(out: Path) -> bool:
    """Whether `-o` is named like an audio file (`out/x.wav`) and is no folder yet: a file's name where every
    command takes a folder (an existing folder of that name is taken as it is)."""
    from ..io.audio import FORMATS

    return out.suffix.lower().lstrip(".") in FORMATS and not out.is_dir()


def check_output(audio_format: str, loudness: float | None) -> str:
    """The audio format as files are named (`FLAC` and `.flac` are `flac`); fails on a bad format or level."""
    from ..io.audio import FORMATS

    kind = audio_format.strip().lower().removeprefix(".")
    if kind not in FORMATS:
        fail(f"--format {audio_format!r}: choose {either(tuple(FORMATS))}")
    if loudness is not None and not -70.0 <= loudness <= 0.0:
        fail(f"--loudness {loudness:g}: choose a level from -70 to 0 LUFS (e.g. -23 or -16)")
    return kind


def check_out_apart(out: Path, model: Path, flag: str = "--out") -> None:
    """Refuse an output directory that is the checkpoint directory or its codec's folder (-o and -m mixed up):
    the audio and results.jsonl would be written among the weights. A folder of its own inside one is fine."""
    try:
        out_at, model_at = out.resolve(), model.resolve()
    except (OSError, RuntimeError):  # (a loop of links: refused where the path is used)
        return
    if out_at in (model_at, model_at / "speech_tokenizer"):
        what = "the checkpoint directory" if out_at == model_at else f"the codec folder of checkpoint {model}"
        fail(f"{flag} {out}: is {what}; write the outputs to a folder of their own")


def check_runaway(retries: int, greedy: bool, max_frames: int | None) -> None:
    """--retry-runaway retries sampled items that ran out of the budget derived from their text: with --greedy or
    --max-frames it could retry none, so the pair is refused rather than the retries silently not happening."""
    if retries and greedy:
        fail(f"--retry-runaway {retries} retries sampled items with new seeds; under --greedy a retry gives the "
             "same audio (drop one of them)")
    if retries and max_frames is not None:
        fail(f"--retry-runaway {retries} retries items that ran out of the budget derived from their text; "
             "--max-frames gives every item its own budget, so none would be (drop one of them)")


class Inputs:
    """The files synth reads that lie in OUT itself (the manifest, a line's ref_audio), and the ids it
    writes: an item's audio (or codes) named like one of them would replace it, or delete it as the file of an
    earlier --format (`Batch._drop_earlier`): id "alice" with "ref_audio": "alice.wav" and the manifest's folder
    as OUT destroyed the reference clip. Refused before anything is written."""

    def __init__(self, out: Path, manifest: Path, fold_case):
        self.out, self.manifest, self.folder, self.fold = out, manifest, out.resolve(), fold_case is not None
        self.read: dict[str, tuple[str, str]] = {}  # a file's name in OUT (as the ids are compared) -> (name, reader)
        self.ids: set[str] = set()
        self._note(manifest, "the manifest")

    def _key(self, name: str) -> str:
        return name.lower() if self.fold else name

    def _note(self, path, what: str) -> None:
        if not isinstance(path, (str, Path)):
            return
        # The file it leads to, and where the path itself lies: a symbolic link in OUT is replaced by the item's
        # audio as a file would be (the clip it pointed at stays, but the line, and a re-run, read the new audio)
        for place in (Path(path).resolve(), Path(os.path.abspath(path)).parent.resolve() / Path(path).name):
            if place.parent == self.folder:
                self.read.setdefault(self._key(place.name), (place.name, what))

    def add(self, entry) -> None:
        request = getattr(entry, "request", None)
        if request is not None:
            self._note(request.ref_audio, f"the ref_audio of {self.manifest}:{entry.line}")  # (a voice: .safetensors)

    def writes(self, entry) -> None:  # (the manifest pass holds each id already: the set adds no strings)
        self.ids.add(self._key(entry.request.id))

    def clobbered(self) -> str | None:
        from ..io.audio import FORMATS

        for key, (name, what) in self.read.items():
            stem = key.removesuffix(".codes.npy") if key.endswith(".codes.npy") else key.rpartition(".")[0]
            if stem in self.ids and (key.endswith(".codes.npy") or key.rpartition(".")[2] in FORMATS):
                stem = name[:len(stem)]  # as the file spells it
                return (f"--out {self.out}: {what}, {self.out / name}, is named as item {stem!r}'s output, which "
                        "the run replaces (or deletes, under another --format); choose another --out (or rename the "
                        "id or the file)")
        return None


def worker_devices(engine: dict, device: str | None, workers: int | None, devices: str | None):
    """The device of each worker process (None: the single-process run); sets engine["device"] to their
    kind. Refuses, with one line and exit 2, lists it cannot parse and flags that disagree."""
    from ..workers import DevicesError, kind_of, parse_devices

    try:
        listed = parse_devices(devices, workers, engine["device"])
    except DevicesError as exc:
        fail(str(exc))
    if listed is not None and devices is not None:
        kind = kind_of(listed[0])
        if device is not None and device != kind:
            fail(f"--device {device} and --devices {devices!r} disagree; give one of them")
        engine["device"] = kind
    return listed


def check_device_indices(devices: list[str]) -> None:
    """Each accelerator index names a device this machine has, and CPU workers have a core each (more only
    share the cores and each loads its own copy of the model: slower, and a way to run out of memory)."""
    import torch

    from ..workers import cpu_cores, kind_of

    kind = kind_of(devices[0])
    if kind == "cpu":
        if len(devices) > (cores := cpu_cores()):
            fail(f"{len(devices)} CPU workers: omnitts may use {plural(cores, 'CPU core')} here, and CPU workers split "
                 f"them (each loads its own copy of the model); give at most {cores}")
        return
    count = torch.cuda.device_count() if kind == "cuda" else torch.npu.device_count()
    for name in devices:
        if int(name.split(":")[1]) >= count:
            fail(f"--devices: {name}: this machine has {plural(count, kind.upper() + ' device')} "
                  f"({kind}:0 to {kind}:{count - 1})" if count else f"--devices: {name}: no {kind} device is visible")


def check_ray(use_ray: bool, address: str | None, devices: str | None, workers: int | None) -> None:
    """--ray's options go together, and Ray must be importable (checked before anything loads)."""
    if not use_ray:
        if address is not None:
            fail("--ray-address goes with --ray (it names the Ray cluster to run on)")
        return
    if devices is not None:
        fail("--devices does not go with --ray: Ray places its actors (--workers N sets how many)")
    if workers is not None and workers < 1:
        fail(f"--workers {workers}: give 1 or more (with --ray: the number of actors)")
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError:
        fail("--ray needs Ray: pip install 'omnitts[ray]'")
    if address is not None and (problem := unanswered(address)):
        fail(f"--ray-address {address}: cannot join the Ray cluster ({problem}); nothing was run")


RAY_PROBE_S = 10.0  # seconds a --ray-address has to accept a connection


def unanswered(address: str, timeout: float = RAY_PROBE_S) -> str | None:
    """Why nothing accepts a connection at Ray address `address` (`host:port`, `ray://host:port`) within `timeout`
    seconds; None if something does, or where it names no host and port ("auto", "local"). ray.init retries a dead
    address for minutes, its warnings flooding stderr, before it gives up (or never, at a refusing one)."""
    import socket

    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except socket.timeout:
        return f"nothing answered at {target} within {timeout:g} s"
    except OSError as exc:  # refused, no such host, no route
        return f"nothing answers at {target}: {exc.strerror or exc}"
    return None
