"""The `omnitts` command line. It owns the terminal: progress, tables and error lines.

synth, validate and info and the checks the commands share live here, demo and voice-clone in demo.py and
voice_clone.py; options.py declares the options they share, running.py runs a synth once its manifest has been
read (progress, signals, summary).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Annotated

import typer

from ..errors import OmniTTSError
from .options import (
    ENGINE_DEFAULTS,
    FLAG,
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
    path,
    plural,
    user_path,
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
            fail(f"{given}: no CUDA device is visible to torch "
                 f"({'CPU workers: --devices cpu,cpu' if devices else 'use --device cpu'})")
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


# The commands after synth, validate and info, in the order --help lists them
from .demo import DEMO_LINES, demo  # noqa: E402 (they use the checks above)
from .voice_clone import voice_clone  # noqa: E402

app.command(cls=Command)(demo)
app.command("voice-clone", cls=Command)(voice_clone)
__all__ = ["DEMO_LINES", "app", "demo", "info", "main", "synth", "validate", "voice_clone"]


def main():
    """The command line: the stop signals' handler (also where the shell started omnitts with SIGINT ignored,
    a background job), then the command. The `omnitts` command enters through `launch.main`, which installs
    the handler before this package is imported and then calls this."""
    install()
    try:
        app()
    except KeyboardInterrupt as exc:  # a stop outside any command (while click parses the arguments)
        stopped(exc)
