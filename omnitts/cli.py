"""The `omnitts` command line. It owns the terminal: progress, tables and error lines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .errors import OmniTTSError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode="markdown",
                  help="Offline batch speech synthesis for Qwen3-TTS-12Hz checkpoints.")

Model = Annotated[Path, typer.Option("--model", "-m", help="Checkpoint directory (Qwen3-TTS-12Hz-*).")]
Out = Annotated[Path, typer.Option("--out", "-o", help="Output directory (one ID.wav per item).")]
Greedy = Annotated[bool, typer.Option("--greedy", help="Argmax decoding in talker and sub-talker (deterministic).")]
MaxFrames = Annotated[Optional[int], typer.Option("--max-frames", min=1, help="Frame budget per item (12.5 frames/s).")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Seed for items without their own.")]
Dtype = Annotated[Optional[str], typer.Option("--dtype", help="auto | float32 | bfloat16 | float16 (language models). auto: bfloat16 on cuda/npu and on CPUs with native bf16 (AVX512-BF16/AMX), else float32. [default: auto]", show_default=False)]
CodecDtype = Annotated[Optional[str], typer.Option("--codec-dtype", help="float32 | bfloat16 for the codec decoder: bfloat16 about halves its time on CPUs with native bf16 (what the official package does in bfloat16) but costs quality, about 20 dB SNR against float32 (README: Speed). [default: float32]", show_default=False)]
Device = Annotated[Optional[str], typer.Option("--device", help="cpu | cuda | npu (npu needs torch_npu and CANN). [default: cpu]", show_default=False)]
MaxBatch = Annotated[Optional[int], typer.Option("--max-batch", min=1, help="Requests decoded together (continuous batching). [default: 8]", show_default=False)]
Eager = Annotated[Optional[bool], typer.Option("--eager/--no-eager", help="No graph capture on cuda/npu (also OMNITTS_EAGER=1). [default: no-eager]", show_default=False)]
RecipeOpt = Annotated[Optional[Path], typer.Option("--recipe", "-r", help="TOML engine settings (recipes/*.toml); flags given on the command line win.")]

ENGINE_DEFAULTS = dict(device="cpu", dtype="auto", codec_dtype="float32", max_batch=8, eager=False)
SaveCodes = Annotated[bool, typer.Option("--save-codes", help="Also write ID.codes.npy, int64 [frames, 16].")]
OfficialTok = Annotated[bool, typer.Option("--official-tokenizer", help="Tokenize like the official qwen-tts package (Mistral regex swap) instead of as the checkpoint defines.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or spinner (for logs); errors and the summary still print.")]
Strict = Annotated[bool, typer.Option("--strict", help="Stop before synthesis if any manifest line is bad.")]
RetryFailed = Annotated[bool, typer.Option("--retry-failed", help="Also retry items that failed in an earlier run.")]
Format = Annotated[str, typer.Option("--format", help="Audio format of the outputs: wav | flac | ogg.")]
ColumnMap = Annotated[Optional[list[str]], typer.Option("--column", help="FIELD=COLUMN: read FIELD from this column (JSON key); repeatable.")]
IdCol = Annotated[Optional[str], typer.Option("--id-column", help="Column holding the id (same as --column id=NAME).")]
TextCol = Annotated[Optional[str], typer.Option("--text-column", help="Column holding the text (same as --column text=NAME).")]
ManifestArg = Annotated[Path, typer.Argument(help="Manifest: JSONL (one {id, text, ...} per line), .csv/.tsv, .parquet, .arrow, or a datasets save_to_disk folder.")]
Loudness = Annotated[Optional[float], typer.Option("--loudness", min=-70.0, max=0.0, help="Normalize each output to this integrated loudness in LUFS (EBU R128; e.g. -23 or -16), peaks limited to -1 dBFS.")]


def _check_device(device: str) -> None:
    from .recipe import DEVICES

    if device not in DEVICES:
        _fail(f"--device {device!r}: choose {', '.join(DEVICES[:-1])} or {DEVICES[-1]}")


def _fail(message: str, code: int = 2):
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


SplitChars = Annotated[Optional[int], typer.Option("--split-chars", min=0, help="Split texts longer than this many characters at sentence boundaries and join the pieces with crossfades (default: about 20 s of speech, 250 Latin / 100 CJK characters; 0: never split).")]
RetryRunaway = Annotated[int, typer.Option("--retry-runaway", min=0, help="Retry items that ran out of their derived frame budget up to N times, each with a derived seed (sampling only).")]
ExportDataset = Annotated[Optional[Path], typer.Option("--export-dataset", help="Also write the finished items as a Hugging Face `datasets` dataset (Audio column) to this folder.")]


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


@app.command()
def synth(
    manifest: ManifestArg,
    model: Model,
    out: Out,
    greedy: Greedy = False,
    max_frames: MaxFrames = None,
    seed: Seed = None,
    dtype: Dtype = None,
    codec_dtype: CodecDtype = None,
    device: Device = None,
    save_codes: SaveCodes = False,
    official_tokenizer: OfficialTok = False,
    quiet: Quiet = False,
    max_batch: MaxBatch = None,
    eager: Eager = None,
    strict: Strict = False,
    retry_failed: RetryFailed = False,
    audio_format: Format = "wav",
    retry_runaway: RetryRunaway = 0,
    loudness: Loudness = None,
    export_dataset: ExportDataset = None,
    split_chars: SplitChars = None,
    column: ColumnMap = None,
    id_column: IdCol = None,
    text_column: TextCol = None,
    recipe: RecipeOpt = None,
):
    """Synthesize every line of MANIFEST into OUT/ID.wav, recording each in OUT/results.jsonl.

    Bad lines are reported (file:line: field: problem) and recorded as errors while the rest run;
    re-running the same command skips what is done. Ctrl-C stops starting new items and finishes the
    running ones (twice: drops them too); either way the same command resumes. Exit code 1 if any
    item failed. Engine settings come from the flags, else from --recipe, else the defaults shown.
    """
    from .batch.manifest import BadLine, column_map, iter_manifest
    from .batch.outdir import Batch, Settings
    from .config import load_config

    try:
        engine = _engine_options(recipe, device=device, dtype=dtype, codec_dtype=codec_dtype, max_batch=max_batch,
                                 eager=eager)
    except OmniTTSError as exc:
        _fail(str(exc))
    device = engine["device"]
    _check_device(device)
    from .recipe import CODEC_DTYPES

    if engine["codec_dtype"] not in CODEC_DTYPES:
        _fail(f"--codec-dtype {engine['codec_dtype']!r}: choose {' or '.join(CODEC_DTYPES)}")
    if audio_format not in ("wav", "flac", "ogg"):
        _fail(f"--format {audio_format!r}: choose wav, flac or ogg")
    settings = Settings(greedy=greedy, max_frames=max_frames, seed=seed, save_codes=save_codes, format=audio_format,
                        retry_failed=retry_failed, retry_runaway=retry_runaway, loudness=loudness,
                        split_chars=split_chars)
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

    load_kwargs = dict(engine, official_tokenizer=official_tokenizer)
    try:
        stopped = _run(batch, items(), good + bad, model, load_kwargs, quiet)
    except OmniTTSError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        typer.echo(f"interrupted: finished items are recorded in {out}/results.jsonl; run the same command "
                   "again to resume", err=True)
        raise typer.Exit(130)
    if export_dataset is not None and batch.tally.done + batch.tally.skipped:
        from .batch.export import export_dataset as export

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
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from .api import load
    from .engine.pipeline import Pipeline

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
        batch.sample_rate = tts.sample_rate
        pipeline = Pipeline(tts, retry_runaway=batch.settings.retry_runaway, stop=stopping.requested,
                            split=batch.settings.splitter(), sink=batch.sink)
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
    for item_id, message in t.errors:
        console.print(f"  failed {item_id}: {message}")
    if t.failed > len(t.errors):
        console.print(f"  ... and {t.failed - len(t.errors)} more (see {batch.out}/results.jsonl)")


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


@app.command()
def info(model: Annotated[Path, typer.Argument(help="Checkpoint directory.")]):
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
        ("size", d["size"]),
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


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="Where the demo writes its audio.")] = Path("out/demo"),
    model_dir: Annotated[Optional[Path], typer.Option("--model-dir", help="Where the tiny demo checkpoint is built. [default: .cache/demo-tiny-customvoice, -voicedesign or -base]", show_default=False)] = None,
    kind: Annotated[str, typer.Option("--kind", help="Checkpoint kind to build: custom_voice | voice_design | base.")] = "custom_voice",
):
    """Build a tiny random checkpoint and synthesize a small manifest with it.

    The weights are random, so the audio is noise-like; the run shows the whole pipeline working.
    """
    import json

    from .testing.checkpoint import build_checkpoint

    if kind not in DEMO_LINES:
        _fail(f"--kind {kind!r}: choose {', '.join(DEMO_LINES)}")
    model_dir = model_dir or Path(f".cache/demo-tiny-{kind.replace('_', '')}")
    if not (model_dir / "model.safetensors").exists():
        typer.echo(f"building tiny demo checkpoint in {model_dir}", err=True)
        build_checkpoint(model_dir, kind=kind, preset="tiny-0.6b" if kind == "base" else "tiny-1.7b")
    out.mkdir(parents=True, exist_ok=True)
    if kind == "base":
        _write_demo_reference(out / "ref.wav")
    manifest = out / "demo.jsonl"
    manifest.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in DEMO_LINES[kind]), encoding="utf-8")
    synth(manifest, model_dir, out, greedy=True, max_frames=25, seed=0, dtype=None, codec_dtype=None,
          device=None, save_codes=True, official_tokenizer=False, quiet=False, max_batch=None, eager=None,
          strict=False, retry_failed=False, audio_format="wav", retry_runaway=0, loudness=None, export_dataset=None,
          split_chars=None, column=None, id_column=None, text_column=None, recipe=None)


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
    dtype: Dtype = "auto",
    codec_dtype: CodecDtype = "float32",
    device: Device = "cpu",
    official_tokenizer: OfficialTok = False,
):
    """Clone a voice from a reference clip (Base checkpoints): save it, speak with it, or both.

    --save VOICE.safetensors encodes the reference once; manifests then use it with
    {"voice": "VOICE.safetensors", ...} (the voice is tied to this checkpoint's weights).
    --text "..." -o out.wav speaks the text in the cloned voice right away.
    """
    from .api import load
    from .config import load_config
    from .io.audio import FORMATS, load_reference
    from .request import Request
    from .text.prompt import resolve

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
    _check_device(device)
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
