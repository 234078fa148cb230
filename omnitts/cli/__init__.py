"""The `omnitts` command line. It owns the terminal: progress, tables and error lines.

The commands and their checks live here; options.py declares the options they share, running.py runs a
synth once its manifest has been read (progress, signals, summary).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import OmniTTSError
from .options import (
    ENGINE_DEFAULTS,
    FLAG,
    INPUT,
    OUTPUT,
    CodecDtype,
    ColumnMap,
    Command,
    Deterministic,
    Device,
    Devices,
    Dtype,
    Eager,
    ExportDataset,
    Force,
    Format,
    Greedy,
    Group,
    IdCol,
    Loudness,
    ManifestArg,
    MaxBatch,
    MaxFrames,
    Model,
    OfficialTok,
    Out,
    Quiet,
    RayAddress,
    RecipeOpt,
    RetryFailed,
    RetryRunaway,
    SaveCodes,
    Seed,
    ShardOpt,
    SplitChars,
    Strict,
    TextCol,
    UseRay,
    Verbose,
    Workers,
    either,
    fail,
    option,
    path,
    plural,
    user_path,
    warnings_as_lines,
)
from ..stops import install, stopped
from .running import os_error, run_synth

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown", cls=Group,
                  help="Offline batch speech synthesis for Qwen3-TTS-12Hz checkpoints.")


def _show_version(value: bool) -> None:
    if value:
        import platform
        from importlib.metadata import version  # torch's, without importing it

        from ..version import __version__

        typer.echo(f"omnitts {__version__} (torch {version('torch')}, Python {platform.python_version()})")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", metavar=FLAG, is_eager=True, callback=_show_version,
                                               help="Print the version and exit.")] = False):
    """Offline batch speech synthesis for Qwen3-TTS-12Hz checkpoints."""


class _LogToStderr(logging.Handler):
    """The "omnitts" logger's lines on stderr, as they are (`typer.echo` finds the current stderr)."""

    def emit(self, record: logging.LogRecord) -> None:
        typer.echo(self.format(record), err=True)


_LOG = _LogToStderr()


def _show_log(quiet: bool) -> None:
    """Show the library's INFO notes (such as the one-time kernel build) unless `quiet`; warnings always."""
    logger = logging.getLogger("omnitts")
    if _LOG not in logger.handlers:
        logger.addHandler(_LOG)
    _LOG.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.setLevel(logging.INFO)


def _check_engine(engine: dict, devices: str | None = None, recipe: Path | None = None) -> None:
    """Reject a bad device, dtype or codec dtype (and a device this machine lacks) before anything loads;
    `devices`: the --devices list the device kind came from, named in the error instead of --device; `recipe`:
    the recipe it came from (no --device given), named instead (`--device cuda` was never typed)."""
    from ..recipe import CODEC_DTYPES, DEVICES, DTYPES

    for flag, name, choices in (("--device", "device", DEVICES), ("--dtype", "dtype", DTYPES),
                                ("--codec-dtype", "codec_dtype", CODEC_DTYPES)):
        if engine[name] not in choices:
            fail(f"{flag} {engine[name]!r}: choose {either(choices)}")
    kind = engine["device"]
    given = f"--devices {devices}" if devices else f'{recipe}: device = "{kind}"' if recipe else f"--device {kind}"
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail(f"{given}: no CUDA device is visible to torch (use --device cpu)")
    elif kind == "npu":
        from ..device.npu import import_torch_npu

        try:
            import_torch_npu(given)
        except OmniTTSError as exc:
            fail(str(exc))


def _check_output(audio_format: str, loudness: float | None) -> str:
    """The audio format as files are named (`FLAC` and `.flac` are `flac`); fails on a bad format or level."""
    from ..io.audio import FORMATS

    kind = audio_format.strip().lower().removeprefix(".")
    if kind not in FORMATS:
        fail(f"--format {audio_format!r}: choose {either(tuple(FORMATS))}")
    if loudness is not None and not -70.0 <= loudness <= 0.0:
        fail(f"--loudness {loudness:g}: choose a level from -70 to 0 LUFS (e.g. -23 or -16)")
    return kind


def _engine_options(recipe, **flags) -> dict:
    """Each engine option from the flag if given (not None), else the recipe, else ENGINE_DEFAULTS.

    Also applies the recipe's [env] (variables the user exported win): call it before torch
    initialises a device.
    """
    from ..recipe import apply_env, load_recipe

    given = {}
    if recipe is not None:
        loaded = load_recipe(recipe)
        apply_env(loaded)
        given = loaded.engine_options()
    options = {**ENGINE_DEFAULTS, **given}
    options.update({name: value for name, value in flags.items() if value is not None})
    return options


@app.command(cls=Command)
def synth(
    manifest: ManifestArg,
    model: Model,
    column: ColumnMap = None,
    id_column: IdCol = None,
    text_column: TextCol = None,
    split_chars: SplitChars = None,
    strict: Strict = False,
    shard: ShardOpt = None,
    greedy: Greedy = False,
    max_frames: MaxFrames = None,
    seed: Seed = None,
    retry_runaway: RetryRunaway = 0,
    official_tokenizer: OfficialTok = False,
    device: Device = None,
    dtype: Dtype = None,
    codec_dtype: CodecDtype = None,
    max_batch: MaxBatch = None,
    eager: Eager = None,
    deterministic: Deterministic = False,
    workers: Workers = None,
    devices: Devices = None,
    recipe: RecipeOpt = None,
    use_ray: UseRay = False,
    ray_address: RayAddress = None,
    out: Out = ...,  # required; listed here so that the Output panel comes last in --help
    audio_format: Format = "wav",
    save_codes: SaveCodes = False,
    loudness: Loudness = None,
    export_dataset: ExportDataset = None,
    retry_failed: RetryFailed = False,
    force: Force = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
):
    """Synthesize every line of MANIFEST into OUT/ID.wav, recorded in OUT/results.jsonl.

    Bad lines are reported as file:line: field: problem and the rest run. Running the same
    command again resumes: finished items are skipped. Ctrl-C or SIGTERM finishes the running
    items (twice: drops them). Engine settings: the flag, else --recipe, else the default.

    --workers N / --devices LIST run one engine process per device on the shared OUT; items are
    pulled as workers free up, and a dead worker's items are taken over by the others.

    Exit code 0 when every item has audio; 1 when some have none (failed in this run or an
    earlier one) or a write failed (a full disk...); 2 for a usage error, a bad file or --out, or a bad line
    with --strict; 130 on Ctrl-C; 143 on SIGTERM.
    """
    from ..batch.ledger import NAME as LEDGER_NAME
    from ..batch.manifest import BadLine, column_map, iter_manifest
    from ..batch.outdir import Batch, Settings, case_folding, check_out
    from ..batch.shard import in_shard, parse_shard
    from ..batch.sources import check_rereadable
    from ..config import load_config
    from ..voice import checkpoint_identity

    _show_log(quiet)
    # Every option is checked before the manifest is read and long before the model loads.
    try:
        engine = _engine_options(recipe, device=device, dtype=dtype, codec_dtype=codec_dtype, max_batch=max_batch,
                                 eager=eager, deterministic=deterministic or None)  # (off: the recipe's say)
        shard = parse_shard(shard) if shard is not None else None
    except OmniTTSError as exc:
        fail(str(exc))
    _check_ray(use_ray, ray_address, devices, workers)
    # None: this process synthesizes (or Ray's actors do, `workers` of them)
    workers_on = None if use_ray else _worker_devices(engine, device, workers, devices)
    _check_engine(engine, devices, recipe if device is None else None)  # (the device is the recipe's, or cpu)
    if workers_on is not None:
        _check_device_indices(workers_on)
    audio_format = _check_output(audio_format, loudness)
    _check_runaway(retry_runaway, greedy, max_frames)
    try:
        check_out(out)
        if manifest.resolve() == (out / LEDGER_NAME).resolve():  # each bad line recorded would be read again: no end
            fail(f"--out {out}: {manifest} is its result log, which the run appends to, not a manifest; give the "
                 "manifest its lines came from")
        if export_dataset is not None:
            from ..batch.export import check_target

            check_target(export_dataset, out, manifest)
    except OmniTTSError as exc:
        fail(str(exc))
    settings = Settings(greedy=greedy, max_frames=max_frames, seed=seed, save_codes=save_codes, format=audio_format,
                        retry_failed=retry_failed, force=force, retry_runaway=retry_runaway, loudness=loudness,
                        split_chars=split_chars, official_tokenizer=official_tokenizer)
    # Pass 1, before the model loads: every bad line is reported (and, unless --strict, recorded once OUT passed
    # its checks, by a pass over the bad lines). The passes stream the manifest: memory does not grow with it.
    batch = None  # (an OSError before the Batch exists is reported with it unset)
    with _unmade_unless_used(out, lambda: batch):  # an unusable manifest leaves no empty OUT behind
        try:
            check_rereadable(manifest)
            cfg, columns = load_config(model), column_map(column, id_column, text_column)
            identity = checkpoint_identity(model)  # in every record's fingerprint
            batch = None if strict else Batch(out, settings, cfg, identity, shard=shard)
            fold_case = batch.fold_case if batch is not None else case_folding(out)  # ids alike but for case: one file
            good = bad = 0
            inputs = _Inputs(out, manifest, fold_case)
            for entry in iter_manifest(manifest, cfg, columns, split_chars, fold_case):
                inputs.add(entry)  # every shard's: this shard's items may write over another's reference
                if shard is not None and not in_shard(entry.id if isinstance(entry, BadLine) else entry.request.id,
                                                       *shard):
                    continue  # another shard's line: its process reports it
                if isinstance(entry, BadLine):
                    bad += 1
                    typer.echo(f"error: {entry.message}", err=True)
                    if entry.line == 0:  # the whole file is unusable (empty, a mapped column missing)
                        raise typer.Exit(2)
                else:
                    good += 1
                    inputs.writes(entry)
            if problem := inputs.clobbered():
                fail(problem)
            if bad and batch is not None:  # recorded once OUT is known to be usable: a refused run writes nothing
                batch.record_bad_lines((entry.id, entry.message)  # (another shard's: not recorded here)
                                       for entry in iter_manifest(manifest, cfg, columns, split_chars, fold_case)
                                       if isinstance(entry, BadLine))
        except OmniTTSError as exc:
            fail(str(exc))
        except OSError as exc:
            os_error(exc, out, batch)
    if bad and not good:
        fail(f"{manifest}: no good lines ({plural(bad, 'bad line')}); nothing to synthesize")
    if bad and strict:
        them = "it" if bad == 1 else "them"
        fail(f"--strict: {plural(bad, 'bad line')} in {manifest}; nothing was synthesized (fix {them}, or drop "
              f"--strict to run the {plural(good, 'good line')})")
    try:
        batch = batch or Batch(out, settings, cfg, identity, shard=shard)
    except OmniTTSError as exc:
        fail(str(exc))
    with batch:  # this writer's claims and lock are given up however the run ends
        ray = (ray_address, workers, recipe) if use_ray else None
        run_synth(batch, manifest, model, cfg, columns, split_chars, good, bad, engine, official_tokenizer,
                   export_dataset, quiet, workers_on, ray, verbose)


def _check_runaway(retries: int, greedy: bool, max_frames: int | None) -> None:
    """--retry-runaway retries sampled items that ran out of the budget derived from their text: with --greedy or
    --max-frames it could retry none, so the pair is refused rather than the retries silently not happening."""
    if retries and greedy:
        fail(f"--retry-runaway {retries} retries sampled items with new seeds; under --greedy a retry gives the "
             "same audio (drop one of them)")
    if retries and max_frames is not None:
        fail(f"--retry-runaway {retries} retries items that ran out of the budget derived from their text; "
             "--max-frames gives every item its own budget, so none would be (drop one of them)")


class _Inputs:
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
        if isinstance(path, (str, Path)) and (path := Path(path).resolve()).parent == self.folder:
            self.read.setdefault(self._key(path.name), (path.name, what))

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


@contextmanager
def _unmade_unless_used(out: Path, batch_now):
    """Where synth's first pass ends the run (an unusable manifest or checkpoint), the OUT folder it made for
    the run is removed again, if nothing was written into it (a recorded bad line keeps it). `batch_now()`:
    the Batch opened by then, if any, closed first (its writer's lock file is in OUT)."""
    made = not out.exists()
    try:
        yield
    except typer.Exit:
        if (batch := batch_now()) is not None:
            batch.close()
        if made:
            with suppress(OSError):  # not empty, or gone: left as it is
                out.rmdir()
        raise


def _worker_devices(engine: dict, device: str | None, workers: int | None, devices: str | None):
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


def _check_device_indices(devices: list[str]) -> None:
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


def _check_ray(use_ray: bool, address: str | None, devices: str | None, workers: int | None) -> None:
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


@app.command(cls=Command)
def validate(manifest: ManifestArg, model: Model, column: ColumnMap = None, id_column: IdCol = None,
             text_column: TextCol = None, split_chars: SplitChars = None):
    """Check every line of MANIFEST against the checkpoint's config, without loading weights.

    Prints each bad line as `file:line: field: problem` (`file:row N: ...` for Parquet, Arrow and
    datasets), then `N good, M bad`. Exit code 0 if every line is good, 1 otherwise; 2 when the manifest
    cannot be read (`-`, a folder that is not a dataset, a header naming a column twice, a mapped column
    missing, no line at all...), or for a bad checkpoint or option, as synth. Give the --split-chars the
    synth will run with: how many pieces a long text makes depends on it.
    """
    from ..batch.manifest import BadLine, column_map, iter_manifest
    from ..config import load_config

    good = bad = 0
    try:
        cfg, columns = load_config(model), column_map(column, id_column, text_column)
        for entry in iter_manifest(manifest, cfg, columns, split_chars):
            if isinstance(entry, BadLine) and entry.line == 0:  # the whole file (empty, a mapped column missing)
                fail(entry.message)
            if isinstance(entry, BadLine):
                bad += 1
                typer.echo(entry.message)
            else:
                good += 1
    except OmniTTSError as exc:
        fail(str(exc))
    typer.echo(f"{manifest}: {good} good, {bad} bad")
    if bad:
        raise typer.Exit(1)


@app.command(cls=Command)
def info(model: Annotated[Path, typer.Argument(metavar="MODEL", show_default=False, callback=user_path, parser=path,
                                               help="Checkpoint directory.")]):
    """Describe a checkpoint: kind, size, voices, languages, defaults.

    Reads only the config files and the safetensors headers (no weights are loaded).
    """
    from rich.console import Console
    from rich.table import Table

    from ..info import checkpoint_info, short_count

    try:
        d = checkpoint_info(model)
    except OmniTTSError as exc:
        fail(str(exc))
    kinds = {"custom_voice": "CustomVoice: built-in speakers", "voice_design": "VoiceDesign: voice from a description",
             "base": "Base: voice cloning from reference audio"}
    speakers = {"custom_voice": ", ".join(f"{name} ({d['dialects'][name].replace('_', ' ')})" if name in d["dialects"]
                                         else name for name in d["speakers"]),
                "voice_design": "none (describe the voice with instruct)",
                "base": "none (clone one: ref_audio + ref_text, or ref_audio + x_vector_only)"}[d["kind"]]
    s = d["sampling"]

    def sampling(prefix: str, sample: bool) -> str:
        values = ", ".join(f"{k} {s[prefix + k]}" for k in ("temperature", "top_k", "top_p"))
        return f"sample: {values}" if sample else "greedy"

    rows = [
        ("kind", f"{d['kind']} ({kinds[d['kind']]})"),
        ("size", _size(d)),
        ("parameters", f"{d['parameters']:,} ({short_count(d['parameters'])}); codec {d['codec_parameters']:,} "
                       f"({short_count(d['codec_parameters'])})"),
        ("layers", f"talker {d['talker_layers']} (hidden {d['talker_hidden']}), code predictor "
                   f"{d['predictor_layers']}, {d['code_groups']} codebooks"),
        ("languages", ", ".join(d["languages"])),
        ("speakers", speakers),
        ("instruct", "yes" if d["accepts_instruct"] else "no (0.6B CustomVoice and Base take no instruction)"),
        ("talker sampling", sampling("", s["do_sample"]) + f", repetition_penalty {s['repetition_penalty']}"),
        ("sub-talker sampling", sampling("subtalker_", s["subtalker_dosample"])),
        ("max frames", f"{d['max_frames']} ({d['max_frames'] / d['frame_rate']:.0f} s)"),
        ("audio", f"{d['sample_rate']} Hz mono, {d['frame_rate']:g} frames/s"),
    ]
    table = Table(show_header=False, title=str(model), title_justify="left")
    for key, value in rows:
        table.add_row(key, value)
    Console().print(table)


def _size(d: dict) -> str:
    """The size row of `info`: what the shapes say, and the config's name where that differs."""
    if d["size"] == d["config_size"]:
        return d["size"]
    return f"{d['size']} (its config says {d['config_size']}, which sets its behaviour)"


DEMO_LINES = {
    "custom_voice": [
        {"id": "hello", "text": "Hello from omnitts.", "language": "english", "speaker": "ryan"},
        {"id": "instruct", "text": "Speak slowly, please.", "language": "english", "speaker": "vivian", "instruct": "Calm and slow."},
        {"id": "dialect", "text": "你好，世界。", "language": "chinese", "speaker": "eric"},
    ],
    "voice_design": [
        {"id": "narrator", "text": "Once upon a time.", "language": "english", "instruct": "A warm, low male voice."},
        {"id": "bright", "text": "Good morning, everyone!", "language": "english", "instruct": "A bright, fast young voice."},
    ],
    "base": [
        {"id": "clone", "text": "Now in the cloned voice.", "language": "english", "ref_audio": "ref.wav",
         "ref_text": "This is the reference clip."},
        {"id": "xvector", "text": "Only the speaker embedding.", "language": "english", "ref_audio": "ref.wav",
         "x_vector_only": True},
    ],
}


@app.command(cls=Command)
def demo(
    model_dir: Annotated[Optional[Path], option("--model-dir", callback=user_path, parser=path, panel=INPUT, metavar="DIR",
                                                 help="Where the checkpoint is built. [default: "
                                                      ".cache/demo-tiny-customvoice, .cache/demo-tiny-voicedesign, "
                                                      ".cache/demo-tiny-base]")] = None,
    kind: Annotated[str, option("--kind", panel=INPUT, metavar="KIND", show_default=True,
                                 help="custom_voice, voice_design or base.")] = "custom_voice",
    out: Annotated[Optional[Path], option("--out", "-o", callback=user_path, parser=path, panel=OUTPUT, metavar="DIR",
                                           help="Output directory. [default: out/demo-KIND]")] = None,
    force: Force = False,
):
    """Build a tiny random checkpoint and synthesize a small manifest with it.

    The weights are random, so the audio is noise-like; the run shows the whole pipeline working.
    Each kind writes to its own folder: out/demo-custom_voice, out/demo-voice_design, out/demo-base.
    """
    import json

    from ..batch.outdir import check_out
    from ..config import load_config
    from ..io.atomic import atomic_write

    if kind not in DEMO_LINES:
        fail(f"--kind {kind!r}: choose {', '.join(DEMO_LINES)}")
    model_dir = model_dir or Path(f".cache/demo-tiny-{kind.replace('_', '')}")
    out = out or Path(f"out/demo-{kind}")
    built = all((model_dir / name).is_file() for name in ("model.safetensors", "speech_tokenizer/model.safetensors"))
    # The demo's own files in OUT: written where absent, kept where a demo run wrote them, and never written over
    # a file of the user's (an existing -o holding a demo.jsonl or ref.wav of its own)
    manifests = {name: "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode()
                 for name, lines in DEMO_LINES.items()}
    own = {out / "demo.jsonl": manifests[kind]}
    if kind == "base":
        own[out / "ref.wav"] = _demo_reference_wav()
    try:  # both checked before anything is built or written
        check_out(out)
        for path, data in own.items():
            if path.exists() and not (path.is_file() and (there := path.read_bytes()) == data):
                if path.name == "demo.jsonl" and (ran := [k for k, m in manifests.items() if m == there]):
                    fail(f"--out {out}: holds the {ran[0]} demo's run, not {kind}'s; pass --kind {ran[0]}, or "
                         "another -o")
                fail(f"--out {out}: holds a {path.name} that the demo did not write, and the demo writes its own "
                     "there; choose another -o (or move the file)")
        if not built:
            check_out(model_dir, "--model-dir")
        elif (built_kind := load_config(model_dir).model_type) != kind:  # its lines would fail on another kind
            fail(f"--model-dir {model_dir}: holds a {built_kind} checkpoint, not {kind}; pass --kind {built_kind}, "
                 "or another --model-dir to build one")
    except OmniTTSError as exc:
        fail(str(exc))
    if not built:
        if model_dir.is_dir() and any(model_dir.iterdir()):
            fail(f"--model-dir {model_dir}: not empty and not a demo checkpoint; the demo builds its checkpoint in "
                 "a new or empty folder (choose another --model-dir)")
        typer.echo(f"building tiny demo checkpoint in {model_dir}", err=True)
        _build_demo_checkpoint(model_dir, kind)
    out.mkdir(parents=True, exist_ok=True)
    for path, data in own.items():
        if not path.exists():
            with atomic_write(path) as tmp:
                Path(tmp).write_bytes(data)
    synth(manifest=out / "demo.jsonl", model=model_dir, out=out, greedy=True, max_frames=25, seed=0, dtype=None,
          codec_dtype=None, device=None, save_codes=True, official_tokenizer=False, quiet=False, max_batch=None,
          eager=None, deterministic=False, workers=None, devices=None, strict=False, retry_failed=False, force=force,
          audio_format="wav",
          retry_runaway=0,
          loudness=None, export_dataset=None, split_chars=None, column=None, id_column=None, text_column=None,
          recipe=None)


def _build_demo_checkpoint(model_dir: Path, kind: str) -> None:
    """Build into a folder beside `model_dir`, renamed into place when complete: an interrupted build leaves
    no half checkpoint (the next demo would refuse the folder) but a hidden folder the next build replaces."""
    import shutil

    from ..testing.checkpoint import build_checkpoint

    building = model_dir.parent / f".{model_dir.name}.building"
    shutil.rmtree(building, ignore_errors=True)
    build_checkpoint(building, kind=kind, preset="tiny-0.6b" if kind == "base" else "tiny-1.7b")
    if model_dir.is_dir():
        model_dir.rmdir()  # empty (checked)
    building.rename(model_dir)


def _demo_reference_wav() -> bytes:
    """The bytes of a wav file: a 1.5 s voice-like reference clip (a gliding harmonic tone with a syllable rhythm),
    16 kHz."""
    import io

    import numpy as np
    import soundfile as sf

    from ..io.audio import FORMATS

    rate = 16000
    t = np.arange(int(rate * 1.5)) / rate
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.5 * (1 - np.cos(2 * np.pi * 4 * t)) * np.minimum(1, 10 * t) * np.minimum(1, 10 * (1.5 - t))
    wav = io.BytesIO()
    sf.write(wav, (0.25 * voice * envelope).astype(np.float32), rate, format="WAV", subtype=FORMATS["wav"])
    return wav.getvalue()


@app.command("voice-clone", cls=Command)
def voice_clone(
    ctx: typer.Context,
    model: Model,
    ref_audio: Annotated[Path, option("--ref-audio", callback=user_path, parser=path, panel=INPUT, metavar="FILE",
                                       help="Reference clip, ideally 3-10 s of clean speech.")],
    ref_text: Annotated[Optional[str], option("--ref-text", panel=INPUT, metavar="TEXT",
                                               help="Its transcript (in-context cloning).")] = None,
    x_vector_only: Annotated[bool, option("--x-vector-only", panel=INPUT,
                                           help="Clone from the speaker embedding alone.")] = False,
    text: Annotated[Optional[str], option("--text", panel=INPUT, metavar="TEXT",
                                           help="Speak this text in the cloned voice (with -o).")] = None,
    language: Annotated[str, option("--language", panel=INPUT, metavar="NAME", show_default=True,
                                     help="Language of --text.")] = "auto",
    greedy: Greedy = False,
    max_frames: MaxFrames = None,
    seed: Seed = None,
    dtype: Dtype = "auto",
    codec_dtype: CodecDtype = "float32",
    device: Device = "cpu",
    official_tokenizer: OfficialTok = False,
    save: Annotated[Optional[Path], option("--save", callback=user_path, parser=path, panel=OUTPUT, metavar="FILE",
                                            help="Write the voice to this .safetensors file.")] = None,
    out: Annotated[Optional[Path], option("--out", "-o", callback=user_path, parser=path, panel=OUTPUT, metavar="DIR",
                                           help="Output directory for --text: OUT/ID.wav.")] = None,
    item_id: Annotated[str, option("--id", panel=OUTPUT, metavar="ID", show_default=True,
                                    help="File name of the audio, as a manifest id.")] = "clone",
    audio_format: Format = "wav",
):
    """Clone a voice from a reference clip (Base checkpoints): save it, speak with it, or both.

    --save VOICE.safetensors encodes the reference once; manifests then use it with
    {"voice": "VOICE.safetensors", ...} (the voice is tied to this checkpoint's weights).
    --text "..." -o DIR speaks the text in the cloned voice into DIR/ID.wav (--id, --format, --language and
    the Decoding options are for --text alone); the line it prints gives the seed it sampled with (pass it
    as --seed to get the same audio again).
    """
    from ..api import load
    from ..batch.manifest import id_problem
    from ..config import load_config
    from ..errors import RequestError
    from ..io.audio import FORMATS, load_reference
    from ..request import Request
    from ..text.prompt import not_text, resolve
    from ..voice import check_replaceable

    _show_log(False)
    _check_engine(dict(device=device, dtype=dtype, codec_dtype=codec_dtype))
    audio_format = _check_output(audio_format, None)
    if save is None and text is None:
        fail("nothing to do: give --save VOICE.safetensors, or --text \"...\" -o DIR, or both")
    if (text is None) != (out is None):
        fail("--text and -o go together: -o names the directory --text is spoken into (OUT/ID.wav)")
    if text is None and (given := [flag for name, flag in _SPEAKING_FLAGS if _given(ctx, name)]):
        fail(f"{given[0]} goes with --text \"...\" -o DIR (it is for the spoken audio); --save alone speaks nothing")
    if out is not None and out.suffix.lower().lstrip(".") in FORMATS and not out.is_dir():
        fail(f"-o {out}: -o is the output directory, as in synth; write -o {out.parent} --id {out.stem}"
              f"{'' if out.suffix.lower() == '.wav' else ' --format ' + out.suffix.lower().lstrip('.')}")
    if out is not None:
        _check_clone_out(out)
    if problem := id_problem(item_id):
        fail(f"--id: {problem}")
    if out is not None and (target := out / f"{item_id}.{audio_format}").resolve() == ref_audio.resolve():
        fail(f"-o {out} --id {item_id}: {target} is the reference clip (--ref-audio), which the spoken audio would "
             "replace; give another --id or -o")
    if save is not None and save.suffix.lower() != ".safetensors":  # as a manifest's voice field takes it
        fail(f"--save {save}: voice files end in .safetensors")
    try:
        if save is not None and save.is_dir():
            fail(f"--save {save}: is a directory; give the voice file's name (VOICE.safetensors)")
    except OSError as exc:  # a path that cannot be looked up (a name too long): pathlib raises it before Python 3.12
        fail(f"--save {save}: {exc.strerror or exc}")
    if save is not None:  # its folder: as -o is checked (a file in the way, read-only, not writable)
        _check_clone_out(save.parent, "--save", save)
        try:  # a voice replaces a voice file, never another (a checkpoint's model.safetensors)
            check_replaceable(save)
        except OmniTTSError as exc:
            fail(f"--save {exc}")
    if x_vector_only and ref_text:
        fail("--ref-text and --x-vector-only exclude each other (x-vector-only cloning uses no transcript)")
    if not x_vector_only and not (ref_text or "").strip():
        fail("--ref-text is required for in-context cloning; give the reference transcript, "
              "or use --x-vector-only")
    if ref_text and (problem := not_text(ref_text)):  # bytes that are not UTF-8 arrive as lone surrogates
        fail(f"--ref-text: {problem}")
    made: list[Path] = []  # the folders of -o made here: removed again, where still empty, if the command fails
    try:
        cfg = load_config(model)
        if cfg.model_type != "base":
            fail(f"{model}: voice cloning needs a Base checkpoint (Qwen3-TTS-12Hz-*-Base); this one is "
                  f"{cfg.model_type}")
        if text is not None:
            resolve(cfg, Request(text, language, ref_audio=ref_audio, ref_text=ref_text, x_vector_only=x_vector_only))
        with warnings_as_lines():  # a clip over 30 s is said once, though clone_voice reads it again
            load_reference(ref_audio, cfg.codec.input_sample_rate, truncate=x_vector_only)  # fails before the load
            if out is not None:
                made = _make_clone_out(out)
            tts = load(model, device=device, dtype=dtype, official_tokenizer=official_tokenizer, max_batch=1,
                       codec_dtype=codec_dtype)
            voice = tts.clone_voice(ref_audio, ref_text, x_vector_only)
        mode = "in-context" if voice.icl else "x-vector only"
        if save is not None:
            voice.save(save)
            typer.echo(f"saved voice {save} ({mode}, {voice.meta['ref_seconds']} s reference; "
                       f"checkpoint {tts.identity})")
        if text is not None:
            result = tts.synthesize(text, language=language, voice=voice, greedy=greedy, max_frames=max_frames,
                                    seed=seed)
            path = result.save(out / f"{item_id}.{audio_format}")
            seeded = "" if result.seed is None else f"; seed {result.seed}"  # None: greedy, nothing drawn
            typer.echo(f"wrote {path} ({result.duration:.2f} s, {result.frames} frames, {result.finish_reason}; "
                       f"{mode} voice{seeded})")
        made = []
    except RequestError as exc:
        fail(_flag_named(str(exc)))
    except OmniTTSError as exc:
        fail(_flag_advice(str(exc)))
    except OSError as exc:  # e.g. -o in a folder that cannot be written
        fail(f"{exc.filename or out or save}: cannot write ({exc.strerror or exc})")
    finally:  # a failed command (a checkpoint that does not load, Ctrl-C) leaves no empty -o behind
        for folder in reversed(made):
            with suppress(OSError):
                folder.rmdir()


# voice-clone's options that only --text's synthesis reads (given without it, they would do nothing unsaid)
_SPEAKING_FLAGS = (("language", "--language"), ("greedy", "--greedy"), ("max_frames", "--max-frames"),
                   ("seed", "--seed"), ("official_tokenizer", "--official-tokenizer"), ("item_id", "--id"),
                   ("audio_format", "--format"))


def _given(ctx: typer.Context, name: str) -> bool:
    """Option `name` was written on the command line (click's parameter source, compared by name: typer may
    bring a click of its own)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


_CLONE_FLAGS = {"text": "--text", "language": "--language", "ref_text": "--ref-text"}


def _flag_named(message: str) -> str:
    """A request's error names its manifest field ("language: 'x' is not known..."); voice-clone's user gave
    the flag, which is named instead."""
    field, sep, rest = message.partition(": ")
    return f"{_CLONE_FLAGS[field]}: {rest}" if sep and field in _CLONE_FLAGS else message


# A reference's advice names the manifest's fields (io/audio.py: "trim the clip (and its ref_text) ..., or set
# x_vector_only"); voice-clone's user gives flags
_CLONE_ADVICE = (("(and its ref_text)", "(and its --ref-text)"), ("or set x_vector_only", "or use --x-vector-only"))


def _flag_advice(message: str) -> str:
    """`message` with the advice it ends with in voice-clone's flags (the start names a file: left as it is)."""
    for field, flag in _CLONE_ADVICE:
        head, sep, tail = message.rpartition(field)
        message = head + flag + tail if sep else message
    return message


def _check_clone_out(out: Path, flag: str = "-o", given: Path | None = None) -> None:
    """voice-clone's -o (or the folder of its --save file, `given`), checked with the arguments: a directory, or
    a path one can be made at, that can be written."""
    from ..batch.outdir import check_out

    try:
        check_out(out, flag, given)
    except OmniTTSError as exc:
        fail(str(exc))


def _make_clone_out(out: Path) -> list[Path]:
    """Make voice-clone's -o before the model loads: `check_out` cannot see every refusal (/proc, where root
    passes the permission check). Returns the folders it made, outermost first."""
    missing = [folder for folder in (out, *out.parents) if not folder.exists()][::-1]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"-o {out}: cannot make the directory ({exc.strerror or exc}); -o is the output directory")
    return missing


def main():
    """The command line: the stop signals' handler (also where the shell started omnitts with SIGINT ignored,
    a background job), then the command. The `omnitts` command enters through `launch.main`, which installs
    the handler before this package is imported and then calls this."""
    install()
    try:
        app()
    except KeyboardInterrupt as exc:  # a stop outside any command (while click parses the arguments)
        stopped(exc)
