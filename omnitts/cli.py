"""The `omnitts` command line. It owns the terminal: progress, tables and error lines."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from .errors import OmniTTSError

# Help panels: every option of every command sits in one of these (details in the README).
INPUT, DECODING, ENGINE, OUTPUT = "Input", "Decoding", "Engine", "Output"
FLAG = ""  # metavar of on/off flags: no "<bool>" placeholder (a flag takes no value)


class _PlainHelp:
    """--help itself shows no "<bool>" placeholder either."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = FLAG
        return option


class _Command(_PlainHelp, TyperCommand):
    pass


class _Group(_PlainHelp, TyperGroup):
    pass


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown", cls=_Group,
                  help="Offline batch speech synthesis for Qwen3-TTS-12Hz checkpoints.")


def _option(*names: str, panel: str, metavar: str = FLAG, show_default: bool = False, **kwargs):
    """A typer.Option in help panel `panel`; defaults show only when asked (the help says the others)."""
    return typer.Option(*names, metavar=metavar, rich_help_panel=panel, show_default=show_default, **kwargs)


Model = Annotated[Path, _option("--model", "-m", panel=INPUT, metavar="DIR",
                                help="Checkpoint directory (Qwen3-TTS-12Hz-*).")]
Out = Annotated[Path, _option("--out", "-o", panel=OUTPUT, metavar="DIR",
                              help="Output directory: OUT/ID.wav, OUT/results.jsonl.")]
Greedy = Annotated[bool, _option("--greedy/--no-greedy", panel=DECODING, help="Argmax decoding instead of sampling.")]
MaxFrames = Annotated[Optional[int], _option("--max-frames", panel=DECODING, metavar="N", min=1,
                                             help="Frame budget per item (12.5 frames/s).")]
Seed = Annotated[Optional[int], _option("--seed", panel=DECODING, metavar="N",
                                        help="Seed for items without their own.")]
Dtype = Annotated[Optional[str], _option("--dtype", panel=ENGINE, metavar="TYPE",
                                         help="auto, float32, bfloat16 or float16. [default: auto]")]
CodecDtype = Annotated[Optional[str], _option("--codec-dtype", panel=ENGINE, metavar="TYPE",
                                              help="float32, or bfloat16 (faster, lossier). [default: float32]")]
Device = Annotated[Optional[str], _option("--device", panel=ENGINE, metavar="NAME",
                                          help="cpu, cuda, npu. [default: cpu]")]
MaxBatch = Annotated[Optional[int], _option("--max-batch", panel=ENGINE, metavar="N", min=1,
                                            help="Requests decoded together. [default: 8]")]
Eager = Annotated[Optional[bool], _option("--eager/--no-eager", panel=ENGINE,
                                          help="No graph capture on cuda/npu. [default: no-eager]")]
Deterministic = Annotated[bool, _option("--deterministic", panel=ENGINE,
                                         help="Bitwise audio in any batch.")]
Workers = Annotated[Optional[int], _option("--workers", panel=ENGINE, metavar="N",
                                          help="Engine processes, one per device (cpu: cores split); with --ray: actors.")]
Devices = Annotated[Optional[str], _option("--devices", panel=ENGINE, metavar="LIST",
                                           help="One worker per device: cuda:0,cuda:1 / npu:0-7 / cpu,cpu.")]
RecipeOpt = Annotated[Optional[Path], _option("--recipe", "-r", panel=ENGINE, metavar="FILE",
                                              help="TOML settings; flags win.")]

ENGINE_DEFAULTS = dict(device="cpu", dtype="auto", codec_dtype="float32", max_batch=8, eager=False,
                       deterministic=False)
SaveCodes = Annotated[bool, _option("--save-codes", panel=OUTPUT, help="Also write ID.codes.npy (int64, frames x 16).")]
OfficialTok = Annotated[bool, _option("--official-tokenizer", panel=DECODING,
                                      help="Tokenize as the official qwen-tts package does.")]
Quiet = Annotated[bool, _option("--quiet", "-q", panel=OUTPUT, help="No progress bar; errors and summary still print.")]
Verbose = Annotated[bool, _option("--verbose", "-v", panel=OUTPUT,
                                  help="Also report graph capture costs.")]
Strict = Annotated[bool, _option("--strict", panel=INPUT, help="Synthesize nothing if any manifest line is bad.")]
RetryFailed = Annotated[bool, _option("--retry-failed", panel=OUTPUT,
                                      help="Run again the items an earlier run failed.")]
Force = Annotated[bool, _option("--force", panel=OUTPUT, help="Redo every item, finished ones included.")]
Format = Annotated[str, _option("--format", panel=OUTPUT, metavar="EXT", show_default=True,
                                help="Audio format: wav, flac or ogg.")]
ColumnMap = Annotated[Optional[list[str]], _option("--column", panel=INPUT, metavar="F=COL",
                                                   help="Read field F from column COL; repeatable.")]
IdCol = Annotated[Optional[str], _option("--id-column", panel=INPUT, metavar="COL",
                                         help="Column holding the id (--column id=COL).")]
TextCol = Annotated[Optional[str], _option("--text-column", panel=INPUT, metavar="COL",
                                           help="Column holding the text (--column text=COL).")]
ManifestArg = Annotated[Path, typer.Argument(metavar="MANIFEST", show_default=False,
                                             help="JSONL, CSV/TSV, Parquet, Arrow or a datasets folder.")]
Loudness = Annotated[Optional[float], _option("--loudness", panel=OUTPUT, metavar="LUFS",
                                              help="Normalize each output's loudness (e.g. -23).")]
ShardOpt = Annotated[Optional[str], _option("--shard", panel=INPUT, metavar="K/N",
                                           help="Take only shard K of N (by id), e.g. one per Slurm task.")]
SplitChars = Annotated[Optional[int], _option("--split-chars", panel=INPUT, metavar="N", min=0,
                                              help="Split longer texts at sentences (0: never).")]
RetryRunaway = Annotated[int, _option("--retry-runaway", panel=DECODING, metavar="N", min=0, show_default=True,
                                      help="Retries for items that hit the frame budget.")]
UseRay = Annotated[bool, _option("--ray", panel=ENGINE, help="Run on a Ray cluster: one engine per actor.")]
RayAddress = Annotated[Optional[str], _option("--ray-address", panel=ENGINE, metavar="ADDR",
                                              help="Ray cluster to join (auto, ray://...). [default: local]")]
ExportDataset = Annotated[Optional[Path], _option("--export-dataset", panel=OUTPUT, metavar="DIR",
                                                  help="Also save the results as a datasets dataset.")]

def _show_version(value: bool) -> None:
    if value:
        import platform

        import torch

        from .version import __version__

        typer.echo(f"omnitts {__version__} (torch {torch.__version__}, Python {platform.python_version()})")
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


def _fail(message: str, code: int = 2):
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _either(choices) -> str:
    """("a", "b", "c") -> "a, b or c"."""
    return f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else choices[0]


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _check_engine(engine: dict, devices: str | None = None) -> None:
    """Reject a bad device, dtype or codec dtype (and a device this machine lacks) before anything loads;
    `devices`: the --devices list the device kind came from, named in the error instead of --device."""
    from .recipe import CODEC_DTYPES, DEVICES, DTYPES

    for flag, name, choices in (("--device", "device", DEVICES), ("--dtype", "dtype", DTYPES),
                                ("--codec-dtype", "codec_dtype", CODEC_DTYPES)):
        if engine[name] not in choices:
            _fail(f"{flag} {engine[name]!r}: choose {_either(choices)}")
    if engine["device"] == "cuda":
        import torch

        if not torch.cuda.is_available():
            given = f"--devices {devices}" if devices else "--device cuda"
            _fail(f"{given}: no CUDA device is visible to torch (use --device cpu)")
    elif engine["device"] == "npu":
        from .device.npu import import_torch_npu

        try:
            import_torch_npu()
        except OmniTTSError as exc:
            _fail(str(exc))


def _check_output(audio_format: str, loudness: float | None) -> None:
    from .io.audio import FORMATS

    if audio_format not in FORMATS:
        _fail(f"--format {audio_format!r}: choose {_either(tuple(FORMATS))}")
    if loudness is not None and not -70.0 <= loudness <= 0.0:
        _fail(f"--loudness {loudness:g}: choose a level from -70 to 0 LUFS (e.g. -23 or -16)")


def _engine_options(recipe, **flags) -> dict:
    """Each engine option from the flag if given (not None), else the recipe, else ENGINE_DEFAULTS.

    Also applies the recipe's [env] (variables the user exported win): call it before torch
    initialises a device.
    """
    from .recipe import apply_env, load_recipe

    given = {}
    if recipe is not None:
        loaded = load_recipe(recipe)
        apply_env(loaded)
        given = loaded.engine_options()
    options = {**ENGINE_DEFAULTS, **given}
    options.update({name: value for name, value in flags.items() if value is not None})
    return options


@app.command(cls=_Command)
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
    from .batch.manifest import BadLine, column_map, iter_manifest
    from .batch.outdir import Batch, Settings, check_out
    from .batch.shard import in_shard, parse_shard
    from .config import load_config
    from .voice import checkpoint_identity

    _show_log(quiet)
    # Every option is checked before the manifest is read and long before the model loads.
    try:
        engine = _engine_options(recipe, device=device, dtype=dtype, codec_dtype=codec_dtype, max_batch=max_batch,
                                 eager=eager, deterministic=deterministic or None)  # (off: the recipe's say)
        shard = parse_shard(shard) if shard is not None else None
    except OmniTTSError as exc:
        _fail(str(exc))
    _check_ray(use_ray, ray_address, devices, workers)
    # None: this process synthesizes (or Ray's actors do, `workers` of them)
    workers_on = None if use_ray else _worker_devices(engine, device, workers, devices)
    _check_engine(engine, devices)
    if workers_on is not None:
        _check_device_indices(workers_on)
    _check_output(audio_format, loudness)
    try:
        check_out(out)
        if export_dataset is not None:
            from .batch.export import check_target

            check_target(export_dataset, out)
    except OmniTTSError as exc:
        _fail(str(exc))
    settings = Settings(greedy=greedy, max_frames=max_frames, seed=seed, save_codes=save_codes, format=audio_format,
                        retry_failed=retry_failed, force=force, retry_runaway=retry_runaway, loudness=loudness,
                        split_chars=split_chars)
    # Pass 1, before the model loads: every bad line is reported (and, unless --strict, recorded).
    # Both passes stream the manifest, so memory does not grow with its length.
    try:
        cfg, columns = load_config(model), column_map(column, id_column, text_column)
        identity = checkpoint_identity(model)  # in every record's fingerprint
        batch = None if strict else Batch(out, settings, cfg, identity, shard=shard)
        good = bad = 0
        for entry in iter_manifest(manifest, cfg, columns, split_chars):
            if shard is not None and not in_shard(entry.id if isinstance(entry, BadLine) else entry.request.id,
                                                   *shard):
                continue  # another shard's line: its process reports it
            if isinstance(entry, BadLine):
                bad += 1
                typer.echo(f"error: {entry.message}", err=True)
                if entry.line == 0:  # the whole file is unusable (empty, a mapped column missing)
                    raise typer.Exit(2)
                if batch is not None:
                    batch.record_bad(entry.id, entry.message)
            else:
                good += 1
    except OmniTTSError as exc:
        _fail(str(exc))
    except OSError as exc:
        _os_error(exc, out, batch)
    if bad and not good:
        _fail(f"{manifest}: no good lines ({_plural(bad, 'bad line')}); nothing to synthesize")
    if bad and strict:
        _fail(f"--strict: {_plural(bad, 'bad line')} in {manifest}; nothing was synthesized (fix them, or drop "
              f"--strict to run the {_plural(good, 'good line')})")
    try:
        batch = batch or Batch(out, settings, cfg, identity, shard=shard)
    except OmniTTSError as exc:
        _fail(str(exc))
    with batch:  # this writer's claims and lock are given up however the run ends
        ray = (ray_address, workers, recipe) if use_ray else None
        _synth_run(batch, manifest, model, cfg, columns, split_chars, good, bad, engine, official_tokenizer,
                   export_dataset, quiet, workers_on, ray, verbose)


def _synth_run(batch, manifest, model, cfg, columns, split_chars, good, bad, engine, official_tokenizer,
               export_dataset, quiet, workers_on=None, ray=None, verbose=False):
    """synth after pass 1: run the pending items (here, in one worker process per device of `workers_on`, or
    on Ray with `ray` = (address, actors, recipe)), export, exit code."""
    from .batch.manifest import BadLine, iter_manifest

    out = batch.out

    def items():  # pass 2 (and the export): the good items, read again lazily
        return (entry for entry in iter_manifest(manifest, cfg, columns, split_chars)
                if not isinstance(entry, BadLine))

    load_kwargs = dict(engine, official_tokenizer=official_tokenizer)
    try:
        if ray is not None:
            stopped = _run_ray(batch, items, good + bad, model, load_kwargs, quiet, *ray)
        elif workers_on is None:
            stopped = _run(batch, items(), good + bad, model, load_kwargs, quiet, verbose)
        else:
            from .workers import Plan, cpu_threads

            plan = Plan(manifest, model, columns, out, batch.settings, load_kwargs, cpu_threads(workers_on),
                        batch.shard, since=batch.ledger.offset)
            stopped = _run_workers(batch, workers_on, plan, good, bad, quiet, verbose)
            batch.ledger.refresh()  # what every worker wrote: for the export and the check below
    except OmniTTSError as exc:
        _fail(str(exc))
    except OSError as exc:
        _os_error(exc, out, batch)
    except KeyboardInterrupt as exc:
        typer.echo(f"interrupted: finished items are recorded in {out}/results.jsonl; run the same command "
                   "again to resume", err=True)
        raise typer.Exit(_exit_code(exc))
    if export_dataset is not None and batch.tally.done + batch.tally.skipped + batch.tally.others:
        from .batch.export import export_dataset as export

        current = (item for item in items() if batch.mine(item.request.id) and batch.is_current(item))
        try:
            count = export(out, current, export_dataset)
        except (OSError, OmniTTSError) as exc:
            _export_failed(exc, export_dataset, out, batch)
        typer.echo(f"exported {count} items to {export_dataset}", err=True)
    if stopped:
        raise typer.Exit(stopped)
    if workers_on is not None:
        _check_all_have_audio(batch, items(), bad)
    if batch.tally.failed or batch.tally.earlier_failed:  # some items of the manifest have no audio
        raise typer.Exit(1)


def _worker_devices(engine: dict, device: str | None, workers: int | None, devices: str | None):
    """The device of each worker process (None: the single-process run); sets engine["device"] to their
    kind. Refuses, with one line and exit 2, lists it cannot parse and flags that disagree."""
    from .workers import DevicesError, kind_of, parse_devices

    try:
        listed = parse_devices(devices, workers, engine["device"])
    except DevicesError as exc:
        _fail(str(exc))
    if listed is not None and devices is not None:
        kind = kind_of(listed[0])
        if device is not None and device != kind:
            _fail(f"--device {device} and --devices {devices!r} disagree; give one of them")
        engine["device"] = kind
    return listed


def _check_device_indices(devices: list[str]) -> None:
    """Each accelerator index names a device this machine has (before anything loads)."""
    import torch

    from .workers import kind_of

    kind = kind_of(devices[0])
    if kind == "cpu":
        return
    count = torch.cuda.device_count() if kind == "cuda" else torch.npu.device_count()
    for name in devices:
        if int(name.split(":")[1]) >= count:
            _fail(f"--devices: {name}: this machine has {_plural(count, kind.upper() + ' device')} "
                  f"({kind}:0 to {kind}:{count - 1})" if count else f"--devices: {name}: no {kind} device is visible")


def _check_all_have_audio(batch, items, bad: int) -> None:
    """After the workers: exit 1 if some good item has no current audio, saying so where no failure explains
    it (the worker that held it died and none finished it)."""
    t = batch.tally
    missing = sum(1 for item in items if batch.mine(item.request.id) and not batch.is_current(item))
    unexplained = missing - (t.failed - bad) - t.earlier_failed
    if unexplained > 0:
        typer.echo(f"error: {_plural(unexplained, 'item')} still {'has' if unexplained == 1 else 'have'} no audio "
                   f"(a worker died and no other finished {'it' if unexplained == 1 else 'them'}): run the same "
                   "command again to finish", err=True)
    if missing:
        raise typer.Exit(1)


def _check_ray(use_ray: bool, address: str | None, devices: str | None, workers: int | None) -> None:
    """--ray's options go together, and Ray must be importable (checked before anything loads)."""
    if not use_ray:
        if address is not None:
            _fail("--ray-address goes with --ray (it names the Ray cluster to run on)")
        return
    if devices is not None:
        _fail("--devices does not go with --ray: Ray places its actors (--workers N sets how many)")
    if workers is not None and workers < 1:
        _fail(f"--workers {workers}: give 1 or more (with --ray: the number of actors)")
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError:
        _fail("--ray needs Ray: pip install 'omnitts[ray]'")


def _run_ray(batch, items, total: int, model: Path, load_kwargs: dict, quiet: bool, address: str | None,
             workers: int | None, recipe: Path | None):
    """`_run` on Ray: the manifest's good items as a Ray dataset through `omnitts.ray.Synthesizer` actors.

    Joins the cluster at `address` (a local one when None). Progress counts the metadata rows as they
    stream back; the closing summary and exit code are the normal path's, with results.jsonl (which the
    actors write) the truth for which items have audio. Returns 130/143 if a signal stopped it, else None.
    """
    import warnings

    import ray
    import ray.data
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .batch.ledger import Ledger
    from .ray import BATCH_ROWS, dataset_from_items, synthesize_dataset

    console = Console(stderr=True)
    s, tally = batch.settings, batch.tally
    mine = lambda: (item for item in items() if batch.mine(item.request.id))  # noqa: E731 (this --shard's)
    before = batch.ledger  # what was recorded before the run: a row skipped for a record made since counts as done
    for name in ("ray", "ray.data"):  # Ray Data logs each execution at INFO on its own handler
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="ray")  # e.g. "the operator only received 1 input(s)"
    init = dict(logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
    if address is None:
        init["include_dashboard"] = False
    ray.init(address=address, **init)
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        if workers is None:
            resource = {"cuda": "GPU", "npu": "NPU"}.get(load_kwargs["device"])
            workers = max(1, int(ray.cluster_resources().get(resource, 0))) if resource else 1
        env = {}
        if recipe is not None:
            from .recipe import load_recipe

            env = dict(load_recipe(recipe).env)
        options = dict(load_kwargs, greedy=s.greedy, seed=s.seed, max_frames=s.max_frames, format=s.format,
                       save_codes=s.save_codes, loudness=s.loudness, split_chars=s.split_chars,
                       retry_failed=s.retry_failed, force=s.force, retry_runaway=s.retry_runaway,
                       env=env)
        if not quiet:
            console.print(f"ray: {_plural(workers, 'actor')} on {load_kwargs['device']} "
                          f"({ray.cluster_resources().get('CPU', 0):g} CPUs in the cluster)")
        rows = max(1, min(BATCH_ROWS, -(-(total - tally.failed) // workers)))  # every actor gets blocks to work on
        options["since"] = batch.ledger.offset  # a batch Ray retries finds what this run already did
        meta = synthesize_dataset(dataset_from_items(mine(), chunk_rows=rows), model, batch.out, actors=workers,
                                  batch_size=rows, **options)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[rate]}"))
        with Progress(*columns, console=console, disable=quiet) as progress:
            progress.add_task("synthesizing", total=total, completed=tally.failed, rate="")
            for rows in meta.iter_batches(batch_size=None, batch_format="pyarrow"):
                for row in rows.to_pylist():
                    _count_row(row, before, tally, console)
                _advance(progress, tally)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # an actor that cannot start (checkpoint, device), a full disk in an actor, ...
        message = str(exc).strip().splitlines()
        _fail(f"the Ray run failed: {message[-1] if message else type(exc).__name__} (what is done is kept in "
              f"{batch.out}/results.jsonl; run the same command again to resume)", code=1)
    finally:
        ray.shutdown()
    batch.ledger = Ledger(batch.out)  # results.jsonl as the actors left it: the truth for the exit code and export
    failed = batch.ledger.failed  # items whose last record is a failure are reported as such by the summary
    missing = sum(1 for item in mine() if not batch.is_current(item) and item.request.id not in failed)
    _summary(console, batch)
    if missing > 0:
        console.print(f"{_plural(missing, 'item')} of the manifest still {'has' if missing == 1 else 'have'} no "
                      f"audio in {batch.out}: run the same command again")
        return 1
    return None


def _count_row(row: dict, before, tally, console) -> None:
    """One metadata row of the Ray stage into the closing summary's tally."""
    if row["skipped"] and row["status"] == "ok" and row["id"] in before.done:
        tally.skipped += 1
    elif row["skipped"] and row["status"] != "ok" and row["id"] in before.failed:
        tally.skipped += 1
        tally.earlier_failed += 1
    elif row["status"] == "ok":  # run now (or by an attempt of this run that Ray retried)
        tally.done += 1
        tally.seconds += row["seconds"] or 0.0
        tally.changed += bool(row["changed"])
    else:
        tally.fail(row["id"], row["error"])
        console.print(f"error: {row['id']}: {row['error']}")


def _os_error(exc: OSError, out: Path, batch) -> None:
    """A filesystem error (a full disk, EACCES, EIO, a filesystem turned read-only...) ends the run with
    one line naming the file and the error, exit 1. What is done stays done (nothing is half-written:
    see batch/outdir.py), so the same command resumes once the cause is fixed."""
    from .io.atomic import disk_full, shown_name

    done = len(batch.ledger.done) if batch is not None else 0
    resume = f"{_plural(done, 'item')} done ({out}/results.jsonl); "
    if disk_full(exc):
        _fail(f"no space left on {out}: {resume}free some space and run the same command again to resume", code=1)
    where = shown_name(exc.filename) if exc.filename else out
    _fail(f"cannot write {where}: {_os_reason(exc)}: {resume}fix that and run the same command again to resume",
          code=1)


def _os_reason(exc: OSError) -> str:
    """An OSError's text with its errno's name, e.g. "Permission denied (EACCES)"."""
    import errno

    code = errno.errorcode.get(exc.errno)
    return (exc.strerror or str(exc)) + (f" ({code})" if code else "")


def _export_failed(exc: Exception, target: Path, out: Path, batch) -> None:
    """An export that failed (a full disk...) left nothing behind (batch/export.py); the synthesized items stay
    done, so the same command exports them without synthesizing again. One line, exit 1."""
    from .io.atomic import disk_full

    if disk_full(exc):
        reason = "no space left on device"
    elif isinstance(exc, OSError):
        reason = (f"cannot write {exc.filename}: " if exc.filename else "") + _os_reason(exc)
    else:
        reason = str(exc)
    done = len(batch.ledger.done)
    _fail(f"--export-dataset {target}: {reason}; nothing was exported, the {_plural(done, 'item')} done in {out} "
          "stay done: fix that and run the same command again to export", code=1)


def _run(batch, items, total: int, model: Path, load_kwargs: dict, quiet: bool, verbose: bool = False) -> int | None:
    """Synthesize the pending `items` into `batch`, with a progress bar, Ctrl-C handling and a summary
    (`verbose`: with what graph capture cost).

    Returns the exit code of a signal that stopped the run early (130 Ctrl-C, 143 SIGTERM), else None.
    The loop itself is batch/run.py's (the workers of --workers run the same one).
    """
    from contextlib import ExitStack

    from rich.console import Console

    from .api import load
    from .batch.run import run_items

    console = Console(stderr=True)
    tally = batch.tally
    stopping = _GracefulStop(console)
    progress = _progress(console, quiet)

    with ExitStack() as stack:
        def loaded():  # only when some item is pending: then the bar and the signal handlers start
            if not quiet:
                console.print("loading checkpoint")
            tts = load(model, **load_kwargs)
            stack.enter_context(stopping)
            stack.enter_context(progress)
            progress.add_task("synthesizing", total=total, rate="")
            return tts

        def report(rec: dict) -> None:
            if rec["status"] != "ok":
                console.print(f"error: {rec['id']}: {rec['error']}")
            _advance(progress, tally)

        stats = {}
        run_items(batch, items, loaded, stopping.requested, report, stats)
    stopped = stopping.exit_code if stopping.count else None
    if stopped:
        console.print(f"stopped early: run the same command again to resume ({batch.out}/results.jsonl "
                      "keeps what is done)")
    _summary(console, batch)
    if verbose and stats:
        console.print(_graph_line(stats))
    return stopped


def _graph_line(stats: dict) -> str:
    """The --verbose lines: what capturing frame graphs (and the prefill's and codec's call graphs) cost this run
    (`Pipeline.graph_stats`)."""
    engines = _plural(stats["engines"], "engine")
    calls = "".join(f"\n{what} graph capture: {_plural(stats[f'{what}_captures'], 'graph')} in "
                    f"{stats[f'{what}_capture_seconds']:.2f} s" for what in ("prefill", "codec")
                    if stats.get(f"{what}_captures"))
    if not stats["captures"]:
        return f"graph capture: none (frames ran eagerly; {engines} built){calls}"
    return (f"graph capture: {_plural(stats['captures'], 'graph')} in {stats['capture_seconds']:.2f} s, "
            f"{_plural(stats['warmup_frames'], 'eager warm-up frame')} ({engines} built){calls}")


def _run_workers(batch, devices: list[str], plan, good: int, bad: int, quiet: bool,
                 verbose: bool = False) -> int | None:
    """Run one worker process per device on `batch`'s directory: one progress bar, one summary (`verbose`:
    with what graph capture cost, all workers together).

    The workers report their records here; a worker that dies is named (the others take over its
    items). Returns the exit code of a signal that stopped the run early, as `_run` does.
    """
    from contextlib import ExitStack

    from rich.console import Console

    from .workers import Pool, name

    console = Console(stderr=True)
    tally = batch.tally
    pool = Pool(plan, devices, tally)
    stopping = _ForwardingStop(console, pool)
    progress = _progress(console, quiet)
    with ExitStack() as stack:
        stack.enter_context(stopping)
        stack.callback(pool.shutdown)  # after a second Ctrl-C: the workers get a moment to end, then are killed
        pool.start()
        if not quiet:
            console.print(f"started {_plural(len(devices), 'worker')}: {', '.join(devices)}")
        for event in pool.events():
            kind, index = event[0], getattr(event[1], "index", event[1])
            who = name(index, devices[index])
            if kind == "loading" and not progress.task_ids:
                if not quiet:
                    console.print("loading checkpoint")
                stack.enter_context(progress)
                progress.add_task("synthesizing", total=good + bad, rate="")
            elif kind == "record" and event[3] != "ok":
                console.print(f"error: {event[2]}: {event[4]}")
            elif kind == "error":
                console.print(f"error: {who}: {event[2]}")
            elif kind == "ended" and not event[1].stopped:
                rest = "the others take over its items" if pool.alive() else "its items are left for the next run"
                console.print(f"{who} died: {event[1].reason}; {rest}")
            if progress.task_ids:
                _advance(progress, tally)
    stopped = stopping.exit_code if stopping.count else None
    if stopped:
        console.print(f"stopped early: run the same command again to resume ({batch.out}/results.jsonl "
                      "keeps what is done)")
    elif pool.all_finished():
        # Each worker counts its siblings' items as "others"; a writer outside this command recorded
        # what no worker ran and no earlier run finished.
        tally.others = max(0, good - tally.skipped - tally.done - (tally.failed - bad))
    _summary(console, batch)
    if verbose and pool.graphs:
        console.print(_graph_line(pool.graphs))
    kinds = {kind for _, kind in pool.errors.values()}
    if "disk" in kinds:
        _fail(f"no space left on {batch.out}: {_plural(tally.done, 'item')} done in this run "
              f"({batch.out}/results.jsonl); free some space and run the same command again to resume", code=1)
    if kinds == {"usage"} and len(pool.errors) == len(devices) and not tally.done:
        raise typer.Exit(2)  # every worker refused to start (each said why): nothing could run
    return stopped


def _advance(progress, tally) -> None:
    """Show `tally` on a run's progress bar (its one task): items accounted for, audio written, speed."""
    progress.update(progress.task_ids[0], completed=tally.done + tally.failed + tally.skipped + tally.others,
                    rate=f"{tally.seconds:.1f} s audio, {tally.realtime:.2f}x realtime")


def _progress(console, quiet: bool):
    """The progress bar of a run (items, elapsed, ETA, audio seconds and speed); not started yet."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[rate]}"))
    return Progress(*columns, console=console, disable=quiet)


class _Interrupt(KeyboardInterrupt):
    """Raised by a signal that stops at once: Ctrl-C (SIGINT) or SIGTERM, with the exit code it calls for."""

    def __init__(self, signum: int):
        super().__init__()
        self.exit_code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def _exit_code(exc: KeyboardInterrupt) -> int:
    return getattr(exc, "exit_code", 130)


def _interrupt(signum, frame):
    raise _Interrupt(signum)


class _GracefulStop:
    """First Ctrl-C or SIGTERM: stop starting items, finish the running ones. Second: interrupt at once.

    SIGTERM (what `kill`, schedulers and `docker stop` send) is handled as Ctrl-C is: the run exits 143.
    """

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self, console):
        self.console = console
        self.count = 0
        self.exit_code = 130

    def requested(self) -> bool:
        return self.count > 0

    def _handle(self, signum, frame):
        self.count += 1
        if self.count > 1:
            raise _Interrupt(signum)
        import signal

        self.exit_code = 128 + signum
        again = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM or Ctrl-C"
        self.console.print(f"stopping: finishing the items in progress ({again} again to drop them)")

    def __enter__(self):
        import signal
        import threading

        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                number = getattr(signal, name)
                self.previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc):
        import signal

        for number, handler in self.previous.items():
            signal.signal(number, handler)


class _ForwardingStop(_GracefulStop):
    """The parent of --workers: stops as _GracefulStop does, and passes SIGTERM on to the workers (and a
    SIGINT the terminal did not already deliver to them: `kill -INT PID`, no terminal)."""

    def __init__(self, console, pool):
        super().__init__(console)
        self.pool = pool

    def _handle(self, signum, frame):
        import signal

        from .workers import terminal_signals_group

        self.pool.stopping = self.pool.stopping or signum  # workers ending 130/143 now were stopped, not died
        if signum != signal.SIGINT or not terminal_signals_group():
            self.pool.forward(signum)
        super()._handle(signum, frame)


def _summary(console, batch) -> None:
    """The closing table, the failures, and why items were skipped (with the flag that runs them)."""
    from rich.table import Table

    t = batch.tally
    table = Table(title=f"omnitts synth -> {batch.out}", show_header=True)
    for name in ("done", "failed", "skipped", "audio", "wall time", "speed"):
        table.add_column(name, justify="right")
    table.add_row(str(t.done), str(t.failed), str(t.skipped), _hms(t.seconds), _hms(t.wall),
                  f"{t.realtime:.2f}x realtime" if t.done else "-")
    console.print(table)
    for item_id, message in t.errors:
        console.print(f"  failed {item_id}: {message}")
    if t.failed > len(t.errors):
        console.print(f"  ... and {t.failed - len(t.errors)} more (see {batch.out}/results.jsonl)")
    if t.others:
        console.print(f"{_plural(t.others, 'item')} recorded by other writers of {batch.out} during this run "
                      "(not run here)")
    done_before = t.skipped - t.earlier_failed
    if done_before:
        console.print(f"{_plural(done_before, 'item')} already done in {batch.out}: skipped (--force redoes "
                      f"{'it' if done_before == 1 else 'them'})")
    if t.changed:
        console.print(f"{_plural(t.changed, 'item')} run again: {'its' if t.changed == 1 else 'their'} line or the "
                      "options changed since the earlier run (each file replaced)")
    if t.earlier_failed:
        one = t.earlier_failed == 1
        console.print(f"{_plural(t.earlier_failed, 'item')} failed in an earlier run and still "
                      f"{'has' if one else 'have'} no audio: --retry-failed runs {'it' if one else 'them'} again "
                      f"(errors in {batch.out}/results.jsonl)")


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@app.command(cls=_Command)
def validate(manifest: ManifestArg, model: Model, column: ColumnMap = None, id_column: IdCol = None,
             text_column: TextCol = None):
    """Check every line of MANIFEST against the checkpoint's config, without loading weights.

    Prints each bad line as `file:line: field: problem` (`file:row N: ...` for Parquet, Arrow and
    datasets), then `N good, M bad`. Exit code 0 if every line is good, 1 otherwise.
    """
    from .batch.manifest import BadLine, column_map, iter_manifest
    from .config import load_config

    good = bad = 0
    try:
        cfg, columns = load_config(model), column_map(column, id_column, text_column)
        for entry in iter_manifest(manifest, cfg, columns):
            if isinstance(entry, BadLine):
                bad += 1
                typer.echo(entry.message)
            else:
                good += 1
    except OmniTTSError as exc:
        _fail(str(exc))
    typer.echo(f"{manifest}: {good} good, {bad} bad")
    if bad:
        raise typer.Exit(1)


@app.command(cls=_Command)
def info(model: Annotated[Path, typer.Argument(metavar="MODEL", show_default=False,
                                               help="Checkpoint directory.")]):
    """Describe a checkpoint: kind, size, voices, languages, defaults.

    Reads only the config files and the safetensors headers (no weights are loaded).
    """
    from rich.console import Console
    from rich.table import Table

    from .info import checkpoint_info, short_count

    try:
        d = checkpoint_info(model)
    except OmniTTSError as exc:
        _fail(str(exc))
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


@app.command(cls=_Command)
def demo(
    model_dir: Annotated[Optional[Path], _option("--model-dir", panel=INPUT, metavar="DIR",
                                                 help="Where the checkpoint is built. "
                                                      "[default: .cache/demo-tiny-KIND]")] = None,
    kind: Annotated[str, _option("--kind", panel=INPUT, metavar="KIND", show_default=True,
                                 help="custom_voice, voice_design or base.")] = "custom_voice",
    out: Annotated[Optional[Path], _option("--out", "-o", panel=OUTPUT, metavar="DIR",
                                           help="Output directory. [default: out/demo-KIND]")] = None,
    force: Force = False,
):
    """Build a tiny random checkpoint and synthesize a small manifest with it.

    The weights are random, so the audio is noise-like; the run shows the whole pipeline working.
    Each kind writes to its own folder: out/demo-custom_voice, out/demo-voice_design, out/demo-base.
    """
    import json

    from .testing.checkpoint import build_checkpoint

    if kind not in DEMO_LINES:
        _fail(f"--kind {kind!r}: choose {', '.join(DEMO_LINES)}")
    model_dir = model_dir or Path(f".cache/demo-tiny-{kind.replace('_', '')}")
    out = out or Path(f"out/demo-{kind}")
    if not (model_dir / "model.safetensors").exists():
        typer.echo(f"building tiny demo checkpoint in {model_dir}", err=True)
        build_checkpoint(model_dir, kind=kind, preset="tiny-0.6b" if kind == "base" else "tiny-1.7b")
    out.mkdir(parents=True, exist_ok=True)
    if kind == "base":
        _write_demo_reference(out / "ref.wav")
    manifest = out / "demo.jsonl"
    manifest.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in DEMO_LINES[kind]), encoding="utf-8")
    synth(manifest=manifest, model=model_dir, out=out, greedy=True, max_frames=25, seed=0, dtype=None,
          codec_dtype=None, device=None, save_codes=True, official_tokenizer=False, quiet=False, max_batch=None,
          eager=None, deterministic=False, workers=None, devices=None, strict=False, retry_failed=False, force=force,
          audio_format="wav",
          retry_runaway=0,
          loudness=None, export_dataset=None, split_chars=None, column=None, id_column=None, text_column=None,
          recipe=None)


def _write_demo_reference(path: Path) -> None:
    """A 1.5 s voice-like reference clip (a gliding harmonic tone with a syllable rhythm), 16 kHz."""
    import numpy as np

    from .io.audio import write_audio

    rate = 16000
    t = np.arange(int(rate * 1.5)) / rate
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.5 * (1 - np.cos(2 * np.pi * 4 * t)) * np.minimum(1, 10 * t) * np.minimum(1, 10 * (1.5 - t))
    write_audio(path, (0.25 * voice * envelope).astype(np.float32), rate)


@app.command("voice-clone", cls=_Command)
def voice_clone(
    model: Model,
    ref_audio: Annotated[Path, _option("--ref-audio", panel=INPUT, metavar="FILE",
                                       help="Reference clip, ideally 3-10 s of clean speech.")],
    ref_text: Annotated[Optional[str], _option("--ref-text", panel=INPUT, metavar="TEXT",
                                               help="Its transcript (in-context cloning).")] = None,
    x_vector_only: Annotated[bool, _option("--x-vector-only", panel=INPUT,
                                           help="Clone from the speaker embedding alone.")] = False,
    text: Annotated[Optional[str], _option("--text", panel=INPUT, metavar="TEXT",
                                           help="Speak this text in the cloned voice (with -o).")] = None,
    language: Annotated[str, _option("--language", panel=INPUT, metavar="NAME", show_default=True,
                                     help="Language of --text.")] = "auto",
    greedy: Greedy = False,
    max_frames: MaxFrames = None,
    seed: Seed = None,
    dtype: Dtype = "auto",
    codec_dtype: CodecDtype = "float32",
    device: Device = "cpu",
    official_tokenizer: OfficialTok = False,
    save: Annotated[Optional[Path], _option("--save", panel=OUTPUT, metavar="FILE",
                                            help="Write the voice to this .safetensors file.")] = None,
    out: Annotated[Optional[Path], _option("--out", "-o", panel=OUTPUT, metavar="DIR",
                                           help="Output directory for --text: OUT/ID.wav.")] = None,
    item_id: Annotated[str, _option("--id", panel=OUTPUT, metavar="ID", show_default=True,
                                    help="File name of the audio, as a manifest id.")] = "clone",
    audio_format: Format = "wav",
):
    """Clone a voice from a reference clip (Base checkpoints): save it, speak with it, or both.

    --save VOICE.safetensors encodes the reference once; manifests then use it with
    {"voice": "VOICE.safetensors", ...} (the voice is tied to this checkpoint's weights).
    --text "..." -o DIR speaks the text in the cloned voice into DIR/ID.wav (--id, --format).
    """
    from .api import load
    from .batch.manifest import SAFE_ID
    from .config import load_config
    from .io.audio import FORMATS, load_reference
    from .request import Request
    from .text.prompt import resolve

    _show_log(False)
    _check_engine(dict(device=device, dtype=dtype, codec_dtype=codec_dtype))
    _check_output(audio_format, None)
    if save is None and text is None:
        _fail("nothing to do: give --save VOICE.safetensors, or --text \"...\" -o DIR, or both")
    if (text is None) != (out is None):
        _fail("--text and -o go together: -o names the directory --text is spoken into (OUT/ID.wav)")
    if out is not None and out.suffix.lower().lstrip(".") in FORMATS and not out.is_dir():
        _fail(f"-o {out}: -o is the output directory, as in synth; write -o {out.parent} --id {out.stem}"
              f"{'' if out.suffix.lower() == '.wav' else ' --format ' + out.suffix.lower().lstrip('.')}")
    if not SAFE_ID.match(item_id):
        _fail(f"--id {item_id!r}: not a safe file name (letters, digits, '.', '_', '-')")
    if save is not None and save.suffix != ".safetensors":
        _fail(f"--save {save}: voice files end in .safetensors")
    if x_vector_only and ref_text:
        _fail("--ref-text and --x-vector-only exclude each other (x-vector-only cloning uses no transcript)")
    if not x_vector_only and not (ref_text or "").strip():
        _fail("--ref-text is required for in-context cloning; give the reference transcript, "
              "or use --x-vector-only")
    try:
        cfg = load_config(model)
        if cfg.model_type != "base":
            _fail(f"{model}: voice cloning needs a Base checkpoint (Qwen3-TTS-12Hz-*-Base); this one is "
                  f"{cfg.model_type}")
        if text is not None:
            resolve(cfg, Request(text, language, ref_audio=ref_audio, ref_text=ref_text, x_vector_only=x_vector_only))
        load_reference(ref_audio, cfg.codec.input_sample_rate, truncate=x_vector_only)  # fails before the load
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
            typer.echo(f"wrote {path} ({result.duration:.2f} s, {result.frames} frames, {result.finish_reason}; "
                       f"{mode} voice)")
    except OmniTTSError as exc:
        _fail(str(exc))
    except OSError as exc:  # e.g. -o in a folder that cannot be written
        _fail(f"{out}: cannot write ({exc.strerror or exc})")


def main():
    import signal

    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops as Ctrl-C does (synth: gracefully), exit 143
    try:
        app()
    except KeyboardInterrupt as exc:
        typer.echo("interrupted", err=True)
        sys.exit(_exit_code(exc))


if __name__ == "__main__":
    main()
