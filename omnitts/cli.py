"""The `omnitts` command line. It owns the terminal: progress, tables and error lines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .errors import OmniTTSError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Offline batch speech synthesis for Qwen3-TTS-12Hz checkpoints.")

Model = Annotated[Path, typer.Option("--model", "-m", help="Checkpoint directory (Qwen3-TTS-12Hz-*).")]
Out = Annotated[Path, typer.Option("--out", "-o", help="Output directory (one <id>.wav per item).")]
Greedy = Annotated[bool, typer.Option("--greedy", help="Argmax decoding in talker and sub-talker (deterministic).")]
MaxFrames = Annotated[Optional[int], typer.Option("--max-frames", min=1, help="Frame budget per item (12.5 frames/s).")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Seed for items without their own.")]
Dtype = Annotated[str, typer.Option("--dtype", help="float32 | bfloat16 | float16 (language models; codec stays float32).")]
Device = Annotated[str, typer.Option("--device", help="cpu | cuda | npu (npu needs torch_npu and CANN).")]
MaxBatch = Annotated[int, typer.Option("--max-batch", min=1, help="Requests decoded together (continuous batching).")]
Eager = Annotated[bool, typer.Option("--eager", help="No graph capture on cuda/npu (also OMNITTS_EAGER=1).")]
SaveCodes = Annotated[bool, typer.Option("--save-codes", help="Also write <id>.codes.npy, int64 [frames, 16].")]
OfficialTok = Annotated[bool, typer.Option("--official-tokenizer", help="Tokenize like the official qwen-tts package (Mistral regex swap) instead of as the checkpoint defines.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or spinner (for logs); errors and the summary still print.")]
Strict = Annotated[bool, typer.Option("--strict", help="Stop before synthesis if any manifest line is bad.")]
RetryFailed = Annotated[bool, typer.Option("--retry-failed", help="Also retry items that failed in an earlier run.")]
Format = Annotated[str, typer.Option("--format", help="Audio format of the outputs: wav | flac | ogg.")]
ColumnMap = Annotated[Optional[list[str]], typer.Option("--column", help="FIELD=COLUMN: read FIELD from this column (JSON key); repeatable.")]
IdCol = Annotated[Optional[str], typer.Option("--id-column", help="Column holding the id (same as --column id=NAME).")]
TextCol = Annotated[Optional[str], typer.Option("--text-column", help="Column holding the text (same as --column text=NAME).")]
ManifestArg = Annotated[Path, typer.Argument(help="Manifest: JSONL (one {id, text, ...} per line), .csv/.tsv, .parquet, .arrow, or a datasets save_to_disk folder.")]


def _fail(message: str, code: int = 2):
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


RetryRunaway = Annotated[int, typer.Option("--retry-runaway", min=0, help="Retry items that ran out of their derived frame budget up to N times, each with a derived seed (sampling only).")]
Loudness = Annotated[Optional[float], typer.Option("--loudness", help="Normalize each file to this integrated loudness (LUFS, EBU R128, e.g. -23 or -16), peak-limited below -1 dBFS.")]
ExportDataset = Annotated[Optional[Path], typer.Option("--export-dataset", help="Also write the finished items as a Hugging Face `datasets` dataset (Audio column) to this folder.")]


@app.command()
def synth(
    manifest: ManifestArg,
    model: Model,
    out: Out,
    greedy: Greedy = False,
    max_frames: MaxFrames = None,
    seed: Seed = None,
    dtype: Dtype = "float32",
    device: Device = "cpu",
    save_codes: SaveCodes = False,
    official_tokenizer: OfficialTok = False,
    quiet: Quiet = False,
    max_batch: MaxBatch = 8,
    eager: Eager = False,
    strict: Strict = False,
    retry_failed: RetryFailed = False,
    audio_format: Format = "wav",
    retry_runaway: RetryRunaway = 0,
    loudness: Loudness = None,
    export_dataset: ExportDataset = None,
    column: ColumnMap = None,
    id_column: IdCol = None,
    text_column: TextCol = None,
):
    """Synthesize every line of MANIFEST into OUT/<id>.wav, recording each in OUT/results.jsonl.

    Bad lines are reported (file:line: field: problem) and recorded as errors while the rest run;
    re-running the same command skips what is done. Ctrl-C stops starting new items and finishes the
    running ones (twice: drops them too); either way the same command resumes. Exit code 1 if any
    item failed.
    """
    from .batch import Batch, Settings
    from .config import load_config
    from .manifest import BadLine, column_map, iter_manifest

    if device not in ("cpu", "cuda", "npu"):
        _fail(f"--device {device!r}: choose cpu, cuda or npu")
    if audio_format not in ("wav", "flac", "ogg"):
        _fail(f"--format {audio_format!r}: choose wav, flac or ogg")
    settings = Settings(greedy=greedy, max_frames=max_frames, seed=seed, save_codes=save_codes, format=audio_format,
                        retry_failed=retry_failed, retry_runaway=retry_runaway, loudness=loudness)
    # Pass 1, before the model loads: every bad line is reported (and, unless --strict, recorded).
    # Both passes stream the manifest, so memory does not grow with its length.
    try:
        cfg, columns = load_config(model), column_map(column, id_column, text_column)
        batch = None if strict else Batch(out, settings)
        good = bad = 0
        for entry in iter_manifest(manifest, cfg, columns):
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
    if bad and (strict or not good):
        raise typer.Exit(2)
    batch = batch or Batch(out, settings)

    def items():  # pass 2 (and the export): the good items, read again lazily
        return (entry for entry in iter_manifest(manifest, cfg, columns) if not isinstance(entry, BadLine))

    load_kwargs = dict(device=device, dtype=dtype, official_tokenizer=official_tokenizer, max_batch=max_batch,
                       eager=eager)
    try:
        stopped = _run(batch, items(), good + bad, model, load_kwargs, quiet)
    except OmniTTSError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        typer.echo(f"interrupted: finished items are recorded in {out}/results.jsonl; run the same command "
                   "again to resume", err=True)
        raise typer.Exit(130)
    if export_dataset is not None and batch.tally.done + batch.tally.skipped:
        from .batch import export_dataset as export

        count = export(out, items(), export_dataset)
        typer.echo(f"exported {count} items to {export_dataset}", err=True)
    if stopped:
        raise typer.Exit(130)
    if batch.tally.failed:
        raise typer.Exit(1)


def _run(batch, items, total: int, model: Path, load_kwargs: dict, quiet: bool) -> bool:
    """Synthesize the pending `items` into `batch`, with a progress bar, Ctrl-C handling and a summary.

    Returns whether a Ctrl-C stopped the run early.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from .api import load
    from .pipeline import Pipeline

    console = Console(stderr=True)
    tally = batch.tally
    pending = batch.pending(items)
    first = next(pending, None)
    stopped = False
    if first is not None:
        if not quiet:
            console.print("loading checkpoint")
        tts = load(model, **load_kwargs)
        stopping = _GracefulStop(console)
        pipeline = Pipeline(tts, retry_runaway=batch.settings.retry_runaway, stop=stopping.requested)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[rate]}"))
        with stopping, Progress(*columns, console=console, disable=quiet) as progress:
            task = progress.add_task("synthesizing", total=total, rate="")
            jobs = batch.jobs(tts, _chain(first, pending))
            for outcome in pipeline.run(jobs):
                rec = batch.save(outcome)
                if not outcome.ok:
                    console.print(f"error: {rec['id']}: {rec['error']}")
                progress.update(task, completed=tally.done + tally.failed + tally.skipped,
                                rate=f"{tally.seconds:.1f} s audio, {tally.realtime:.2f}x realtime")
        stopped = stopping.count > 0
        if stopped:
            console.print(f"stopped early: run the same command again to resume ({batch.out}/results.jsonl "
                          "keeps what is done)")
    _summary(console, batch)
    return stopped


def _chain(first, rest):
    yield first
    yield from rest


class _GracefulStop:
    """First Ctrl-C: stop starting items, finish the running ones. Second: interrupt at once."""

    def __init__(self, console):
        self.console = console
        self.count = 0

    def requested(self) -> bool:
        return self.count > 0

    def _handle(self, signum, frame):
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        self.console.print("stopping: finishing the items in progress (Ctrl-C again to drop them)")

    def __enter__(self):
        import signal
        import threading

        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _summary(console, batch) -> None:
    from rich.table import Table

    t = batch.tally
    table = Table(title=f"omnitts synth -> {batch.out}", show_header=True)
    for name in ("done", "failed", "skipped", "audio", "wall time", "speed"):
        table.add_column(name, justify="right")
    table.add_row(str(t.done), str(t.failed), str(t.skipped), _hms(t.seconds), _hms(t.wall),
                  f"{t.realtime:.2f}x realtime")
    console.print(table)
    for item_id, message in t.errors[:20]:
        console.print(f"  failed {item_id}: {message}")
    if len(t.errors) > 20:
        console.print(f"  ... and {len(t.errors) - 20} more (see {batch.out}/results.jsonl)")


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@app.command()
def validate(manifest: ManifestArg, model: Model, column: ColumnMap = None, id_column: IdCol = None,
             text_column: TextCol = None):
    """Check every line of MANIFEST against the checkpoint's config, without loading weights.

    Prints each bad line as `file:line: field: problem` (`file:row N: ...` for Parquet, Arrow and
    datasets), then `N good, M bad`. Exit code 0 if every line is good, 1 otherwise.
    """
    from .config import load_config
    from .manifest import BadLine, column_map, iter_manifest

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


@app.command()
def info(model: Annotated[Path, typer.Argument(help="Checkpoint directory.")]):
    """Describe a checkpoint: kind, size, speakers, languages."""
    from rich.console import Console
    from rich.table import Table

    from .config import config_summary, load_config

    try:
        summary = config_summary(load_config(model))
    except OmniTTSError as exc:
        _fail(str(exc))
    table = Table(show_header=False)
    for key, value in summary.items():
        table.add_row(key, ", ".join(value) if isinstance(value, list) else str(value))
    Console().print(table)


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="Where the demo writes its audio.")] = Path("out/demo"),
    model_dir: Annotated[Path, typer.Option("--model-dir", help="Where the tiny demo checkpoint is built.")] = Path(".cache/demo-tiny-customvoice"),
):
    """Build a tiny random CustomVoice checkpoint and synthesize a 3-line manifest with it.

    The weights are random, so the audio is noise-like; the run shows the whole pipeline working.
    """
    import json

    from .testing.checkpoint import build_checkpoint

    if not (model_dir / "model.safetensors").exists():
        typer.echo(f"building tiny demo checkpoint in {model_dir}", err=True)
        build_checkpoint(model_dir, kind="custom_voice", preset="tiny-1.7b")
    out.mkdir(parents=True, exist_ok=True)
    manifest = out / "demo.jsonl"
    lines = [
        {"id": "hello", "text": "Hello from omnitts.", "language": "english", "speaker": "ryan"},
        {"id": "instruct", "text": "Speak slowly, please.", "language": "english", "speaker": "vivian", "instruct": "Calm and slow."},
        {"id": "dialect", "text": "你好，世界。", "language": "chinese", "speaker": "eric"},
    ]
    manifest.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    synth(manifest, model_dir, out, greedy=True, max_frames=25, seed=0, dtype="float32", device="cpu",
          save_codes=True, official_tokenizer=False, quiet=False, max_batch=8, eager=False, strict=False,
          retry_failed=False, audio_format="wav", retry_runaway=0, loudness=None, export_dataset=None)


@app.command("voice-clone")
def voice_clone(
    model: Model,
    ref_audio: Annotated[Path, typer.Option("--ref-audio", help="Reference clip (wav/flac/ogg/mp3 ...; at least 0.5 s, ideally 3-10 s of clean speech).")],
    ref_text: Annotated[Optional[str], typer.Option("--ref-text", help="Transcript of the reference clip (in-context cloning).")] = None,
    x_vector_only: Annotated[bool, typer.Option("--x-vector-only", help="Clone from the speaker embedding alone (no transcript needed; less close).")] = False,
    save: Annotated[Optional[Path], typer.Option("--save", help="Write the voice to this .safetensors file (use it as a manifest's \"voice\").")] = None,
    text: Annotated[Optional[str], typer.Option("--text", help="Speak this text in the cloned voice (with -o).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Audio file for --text: .wav, .flac or .ogg.")] = None,
    language: Annotated[str, typer.Option("--language", help="Language of --text (a language the checkpoint knows, or auto).")] = "auto",
    greedy: Greedy = False,
    max_frames: MaxFrames = None,
    seed: Seed = None,
    dtype: Dtype = "float32",
    device: Device = "cpu",
    official_tokenizer: OfficialTok = False,
):
    """Clone a voice from a reference clip (Base checkpoints): save it, speak with it, or both.

    --save VOICE.safetensors encodes the reference once; manifests then use it with
    {"voice": "VOICE.safetensors", ...} (the voice is tied to this checkpoint's weights).
    --text "..." -o out.wav speaks the text in the cloned voice right away.
    """
    from .api import load
    from .audio import FORMATS, load_reference
    from .config import load_config
    from .prompt import resolve
    from .request import Request

    if save is None and text is None:
        _fail("nothing to do: give --save VOICE.safetensors, or --text \"...\" -o OUT.wav, or both")
    if (text is None) != (out is None):
        _fail("--text and -o go together: -o names the audio file --text is spoken into")
    if out is not None and out.suffix.lower().lstrip(".") not in FORMATS:
        _fail(f"-o {out}: unsupported audio format; use .wav, .flac or .ogg")
    if save is not None and save.suffix != ".safetensors":
        _fail(f"--save {save}: voice files end in .safetensors")
    if x_vector_only and ref_text:
        _fail("--ref-text and --x-vector-only exclude each other (x-vector-only cloning uses no transcript)")
    if not x_vector_only and not (ref_text or "").strip():
        _fail("--ref-text is required for in-context cloning; give the reference transcript, "
              "or use --x-vector-only")
    if device not in ("cpu", "cuda", "npu"):
        _fail(f"--device {device!r}: choose cpu, cuda or npu")
    try:
        cfg = load_config(model)
        if cfg.model_type != "base":
            _fail(f"{model}: voice cloning needs a Base checkpoint (Qwen3-TTS-12Hz-*-Base); this one is "
                  f"{cfg.model_type}")
        if text is not None:
            resolve(cfg, Request(text, language, ref_audio=ref_audio, ref_text=ref_text, x_vector_only=x_vector_only))
        load_reference(ref_audio, cfg.codec.input_sample_rate)  # a bad clip fails before the weights load
        tts = load(model, device=device, dtype=dtype, official_tokenizer=official_tokenizer, max_batch=1)
        voice = tts.clone_voice(ref_audio, ref_text, x_vector_only)
        mode = "in-context" if voice.icl else "x-vector only"
        if save is not None:
            voice.save(save)
            typer.echo(f"saved voice {save} ({mode}, {voice.meta['ref_seconds']} s reference; "
                       f"checkpoint {tts.identity})")
        if text is not None:
            result = tts.synthesize(text, language=language, voice=voice, greedy=greedy, max_frames=max_frames,
                                    seed=seed)
            result.save(out)
            typer.echo(f"wrote {out} ({result.duration:.2f} s, {result.frames} frames, {result.finish_reason}; "
                       f"{mode} voice)")
    except OmniTTSError as exc:
        _fail(str(exc))
    except OSError as exc:  # e.g. -o in a folder that cannot be written
        _fail(f"{out}: cannot write ({exc.strerror or exc})")


def main():
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
