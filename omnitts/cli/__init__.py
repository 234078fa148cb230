"""The `omnitts` command line. It owns the terminal: progress, tables and error lines.

synth, validate and demo live here, info in describe.py, voice-clone in voice_clone.py; checks.py holds the checks
the commands share, options.py the options they share, demo.py what the demo writes; running.py runs a synth once
its manifest has been read (progress, signals, summary).
"""

from __future__ import annotations

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
    fail,
    option,
    path,
    plural,
    user_path,
)
from ..stops import install, stopped
from .checks import (Inputs, check_device_indices, check_engine, check_out_apart, check_output, check_ray,
                     check_runaway, checkpoint_config, names_audio_file, show_log, worker_devices)
from .demo import DEMO_LINES, build_demo_checkpoint, demo_reference_wav
from .display import Checking
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
    earlier one), a write failed (a full disk...) or MANIFEST changed during the run; 2 for a usage error, a bad
    file or --out, or a bad line with --strict; 130 on Ctrl-C; 143 on SIGTERM; 129 on SIGHUP.
    """
    from ..batch.ledger import NAME as LEDGER_NAME, new_run
    from ..batch.manifest import BadLine, column_map, iter_manifest
    from ..batch.folder import case_folding, check_out
    from ..batch.outdir import Batch
    from ..batch.settings import Settings
    from ..batch.shard import in_shard, parse_shard
    from ..batch.sources import check_rereadable, state
    from ..voice import checkpoint_identity

    show_log(quiet)
    # Every option is checked before the manifest is read and long before the model loads.
    try:
        engine = _engine_options(recipe, device=device, dtype=dtype, codec_dtype=codec_dtype, max_batch=max_batch,
                                 eager=eager, deterministic=deterministic or None)  # (off: the recipe's say)
        shard = parse_shard(shard) if shard is not None else None
    except OmniTTSError as exc:
        fail(str(exc))
    check_ray(use_ray, ray_address, devices, workers)
    # None: this process synthesizes (or Ray's actors do, `workers` of them)
    workers_on = None if use_ray else worker_devices(engine, device, workers, devices)
    check_engine(engine, devices, recipe if device is None else None)  # (the device is the recipe's, or cpu)
    if workers_on is not None:
        check_device_indices(workers_on)
    audio_format = check_output(audio_format, loudness)
    check_runaway(retry_runaway, greedy, max_frames)
    check_out_apart(out, model)
    if names_audio_file(out):  # a folder would be made of the file's name
        fail(f"--out {out}: --out is the output directory (OUT/ID.wav for each line), not a file; give a folder "
             "(one that exists already is taken whatever its name)")
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
            read_as = state(manifest)  # a manifest written to during the run is said so at its end
            cfg, columns = checkpoint_config(model), column_map(column, id_column, text_column)
            identity = checkpoint_identity(model)  # in every record's fingerprint
            run = new_run()  # every record of this command carries it, its workers' and Ray actors' too
            batch = None if strict else Batch(out, settings, cfg, identity, shard=shard, run=run)
            fold_case = batch.fold_case if batch is not None else case_folding(out)  # ids alike but for case: one file
            good = bad = 0
            inputs = Inputs(out, manifest, fold_case)
            with Checking(manifest, quiet) as checking:  # a long manifest's pass is not minutes of silence
                for entry in iter_manifest(manifest, cfg, columns, split_chars, fold_case, max_frames,
                                           official_tokenizer):
                    checking.tick()
                    inputs.add(entry)  # every shard's: this shard's items may write over another's reference
                    if shard is not None and not in_shard(entry.id if isinstance(entry, BadLine)
                                                          else entry.request.id, *shard):
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
                                       for entry in iter_manifest(manifest, cfg, columns, split_chars, fold_case,
                                                                  max_frames, official_tokenizer)
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
        batch = batch or Batch(out, settings, cfg, identity, shard=shard, run=run)
    except OmniTTSError as exc:
        fail(str(exc))
    with batch:  # this writer's claims and lock are given up however the run ends
        ray = (ray_address, workers, recipe) if use_ray else None
        run_synth(batch, manifest, model, cfg, columns, split_chars, good, bad, engine, official_tokenizer,
                   export_dataset, quiet, workers_on, ray, verbose, read_as)


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


@app.command(cls=Command)
def validate(manifest: ManifestArg, model: Model, column: ColumnMap = None, id_column: IdCol = None,
             text_column: TextCol = None, split_chars: SplitChars = None, max_frames: MaxFrames = None,
             official_tokenizer: OfficialTok = False):
    """Check every line of MANIFEST against the checkpoint's config, without loading weights.

    Prints each bad line as `file:line: field: problem` (`file:row N: ...` for Parquet, Arrow and
    datasets), then `N good, M bad`. Exit code 0 if every line is good, 1 otherwise; 2 when the manifest
    cannot be read (`-`, a folder that is not a dataset, a header naming a column twice, a mapped column
    missing, no line at all...), or for a bad checkpoint or option, as synth. Give the --split-chars,
    --max-frames and --official-tokenizer synth will run with: the pieces a long text makes depend on the
    first, and whether each piece's prompt and budget fit the talker's positions on all three (the
    tokenizer counts the tokens).
    """
    from ..batch.manifest import WINDOWS_DEVICES, BadLine, column_map, iter_manifest, location
    from ..batch.sources import open_source

    good = bad = 0
    folded: dict[str, tuple[int, str]] = {}  # id.lower() -> (line, id): synth refuses the later on a case-folding OUT
    unit = None  # "line" or "row": read from the source once a warning needs it
    try:
        cfg, columns = checkpoint_config(model), column_map(column, id_column, text_column)
        for entry in iter_manifest(manifest, cfg, columns, split_chars, max_frames=max_frames,
                                   official_tokenizer=official_tokenizer):
            if isinstance(entry, BadLine) and entry.line == 0:  # the whole file (empty, a mapped column missing)
                fail(entry.message)
            if isinstance(entry, BadLine):
                bad += 1
                typer.echo(entry.message)
                continue
            good += 1
            item_id = entry.request.id
            line, first = folded.setdefault(item_id.lower(), (entry.line, item_id))
            if first != item_id or WINDOWS_DEVICES.match(item_id):
                unit = unit or open_source(manifest).unit
                where = location(manifest, unit, entry.line)
            if first != item_id:
                typer.echo(f"warning: {where}: id: {item_id!r} differs only in case from {unit} {line}'s "
                           f"{first!r}: one file where OUT's filesystem folds case (macOS, Windows, vfat/exFAT, SMB), "
                           "where synth refuses this line; give it another id", err=True)
            if WINDOWS_DEVICES.match(item_id):
                typer.echo(f"warning: {where}: id: {item_id!r} is a device name on Windows: its "
                           f"{item_id}.wav cannot be made or copied there; give it another id if OUT goes there",
                           err=True)
    except OmniTTSError as exc:
        fail(str(exc))
    typer.echo(f"{manifest}: {good} good, {bad} bad")
    if bad:
        raise typer.Exit(1)


from .describe import info  # noqa: E402 (between validate and demo, as --help lists them)

app.command(cls=Command)(info)


KIND_NAMES = {"customvoice": "custom_voice", "voicedesign": "voice_design"}  # the kinds as the README names them


@app.command(cls=Command)
def demo(
    model_dir: Annotated[Optional[Path], option("--model-dir", callback=user_path, parser=path, panel=INPUT, metavar="DIR",
                                                 help="Where the checkpoint is built. [default: "
                                                      ".cache/demo-tiny-customvoice, .cache/demo-tiny-voicedesign, "
                                                      ".cache/demo-tiny-base]")] = None,
    kind: Annotated[str, option("--kind", panel=INPUT, metavar="KIND", show_default=True,
                                 help="custom_voice, voice_design or base (CustomVoice, VoiceDesign, Base).")] = "custom_voice",
    out: Annotated[Optional[Path], option("--out", "-o", callback=user_path, parser=path, panel=OUTPUT, metavar="DIR",
                                           help="Output directory. [default: out/demo-KIND]")] = None,
    force: Force = False,
    quiet: Quiet = False,
):
    """Build a tiny random checkpoint and synthesize a small manifest with it.

    The weights are random, so the audio is noise-like; the run shows the whole pipeline working.
    Each kind writes to its own folder: out/demo-custom_voice, out/demo-voice_design, out/demo-base.
    """
    import json

    from ..batch.folder import check_out
    from ..config import load_config
    from ..io.atomic import atomic_write

    given, kind = kind, KIND_NAMES.get(name := kind.strip().lower().replace("-", "_"), name)  # Base, CustomVoice
    if kind not in DEMO_LINES:
        fail(f"--kind {given!r}: choose {', '.join(DEMO_LINES)}")
    model_dir = model_dir or Path(f".cache/demo-tiny-{kind.replace('_', '')}")
    out = out or Path(f"out/demo-{kind}")
    built = all((model_dir / name).is_file() for name in ("model.safetensors", "speech_tokenizer/model.safetensors"))
    # The demo's own files in OUT: written where absent, kept where a demo run wrote them, and never written over
    # a file of the user's (an existing -o holding a demo.jsonl or ref.wav of its own)
    manifests = {name: "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode()
                 for name, lines in DEMO_LINES.items()}
    own = {out / "demo.jsonl": manifests[kind]}
    if kind == "base":
        own[out / "ref.wav"] = demo_reference_wav()
    check_out_apart(out, model_dir)  # the demo's manifest and audio would land among the weights
    try:  # both checked before anything is built or written
        check_out(out)
        for target, data in own.items():
            if target.exists() and not (target.is_file() and (there := target.read_bytes()) == data):
                if target.name == "demo.jsonl" and (ran := [k for k, m in manifests.items() if m == there]):
                    fail(f"--out {out}: holds the {ran[0]} demo's run, not {kind}'s; pass --kind {ran[0]}, or "
                         "another -o")
                fail(f"--out {out}: holds a {target.name} that the demo did not write, and the demo writes its own "
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
        if not quiet:
            typer.echo(f"building tiny demo checkpoint in {model_dir}", err=True)
        build_demo_checkpoint(model_dir, kind)
    out.mkdir(parents=True, exist_ok=True)
    for target, data in own.items():
        if not target.exists():
            with atomic_write(target) as tmp:
                Path(tmp).write_bytes(data)
    synth(manifest=out / "demo.jsonl", model=model_dir, out=out, greedy=True, max_frames=25, seed=0, dtype=None,
          codec_dtype=None, device=None, save_codes=True, official_tokenizer=False, quiet=quiet, max_batch=None,
          eager=None, deterministic=False, workers=None, devices=None, strict=False, retry_failed=False, force=force,
          audio_format="wav",
          retry_runaway=0,
          loudness=None, export_dataset=None, split_chars=None, column=None, id_column=None, text_column=None,
          recipe=None)


from .voice_clone import voice_clone  # noqa: E402 (after the commands above, as --help lists them)

app.command("voice-clone", cls=Command)(voice_clone)


def main():
    """The command line: the stop signals' handler (also where the shell started omnitts with SIGINT ignored,
    a background job), then the command. The `omnitts` command enters through `launch.main`, which installs
    the handler before this package is imported and then calls this."""
    install()
    try:
        app()
    except KeyboardInterrupt as exc:  # a stop outside any command (while click parses the arguments)
        stopped(exc)
