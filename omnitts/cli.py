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
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
Strict = Annotated[bool, typer.Option("--strict", help="Stop before synthesis if any manifest line is bad.")]
RetryFailed = Annotated[bool, typer.Option("--retry-failed", help="Also retry items that failed in an earlier run.")]
Format = Annotated[str, typer.Option("--format", help="Audio format of the outputs: wav | flac | ogg.")]
Loudness = Annotated[Optional[float], typer.Option("--loudness", min=-70.0, max=0.0, help="Normalize each output to this integrated loudness in LUFS (EBU R128; e.g. -23 or -16), peaks limited to -1 dBFS.")]


def _fail(message: str, code: int = 2):
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def synth(
    manifest: Annotated[Path, typer.Argument(help="JSONL manifest: one {id, text, language, speaker | instruct | ref_audio ...} per line.")],
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
    loudness: Loudness = None,
):
    """Synthesize every line of MANIFEST into OUT/<id>.wav, recording each in OUT/results.jsonl.

    Bad lines are reported (file:line: field: problem) and recorded as errors while the rest run;
    re-running the same command skips what is done. Exit code 1 if any item failed.
    """
    from .config import load_config
    from .manifest import check_manifest

    if device not in ("cpu", "cuda", "npu"):
        _fail(f"--device {device!r}: choose cpu, cuda or npu")
    if audio_format not in ("wav", "flac", "ogg"):
        _fail(f"--format {audio_format!r}: choose wav, flac or ogg")
    try:
        items, bad = check_manifest(manifest, load_config(model))
    except OmniTTSError as exc:
        _fail(str(exc))
    for line in bad:
        typer.echo(f"error: {line.message}", err=True)
    if bad and (strict or not items):
        raise typer.Exit(2)
    settings = dict(greedy=greedy, max_frames=max_frames, seed=seed, save_codes=save_codes, format=audio_format,
                    loudness=loudness)
    try:
        failed = _run(items, bad, model, out, settings, quiet, retry_failed,
                      dict(device=device, dtype=dtype, official_tokenizer=official_tokenizer,
                           max_batch=max_batch, eager=eager))
    except OmniTTSError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        typer.echo(f"interrupted: finished items are in {out}/results.jsonl; run the same command again "
                   "to resume", err=True)
        raise typer.Exit(130)
    if failed:
        raise typer.Exit(1)


def _run(items, bad, model, out, settings, quiet, retry_failed, load_kwargs) -> int:
    """Synthesize `items` not yet done into `out`; returns how many items failed."""
    import time

    import numpy as np
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .api import load
    from .ledger import Ledger, remove_leftovers
    from .loudness import normalize_loudness

    console = Console(stderr=True, quiet=quiet)
    out.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out)
    ledger = Ledger(out)
    for line in bad:
        if ledger.failed.get(line.id, {}).get("error") != line.message:
            ledger.write(_record(line.id, "error", error=line.message))
    todo = [item for item in items if not ledger.is_done(item.request.id, out)
            and (retry_failed or item.request.id not in ledger.failed)]
    skipped = len(items) - len(todo)
    failed, seconds, started = len(bad), 0.0, time.time()
    if todo:
        with console.status("loading checkpoint"):
            tts = load(model, **load_kwargs)
        prepared = []
        for item in todo:
            seed = item.seed if item.seed is not None else settings["seed"]
            params = tts.default_params(settings["greedy"], max_frames=settings["max_frames"], seed=seed)
            try:
                prepared.append((item.request, tts.prepare(item.request), params))
            except OmniTTSError as exc:
                failed += 1
                console.print(f"error: {item.request.id}: {exc}")
                ledger.write(_record(item.request.id, "error", seed=seed, error=str(exc)))
        seeds = {request.id: params.seed for request, _, params in prepared}
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[rate]}"))
        with Progress(*columns, console=console, disable=quiet) as progress:
            task = progress.add_task("synthesizing", total=len(prepared), rate="")
            for result in tts.generate_prepared(prepared):
                name = f"{result.id}.{settings['format']}"
                if settings.get("loudness") is not None:
                    result.audio = normalize_loudness(result.audio, result.sample_rate, settings["loudness"])
                result.save(out / name)
                if settings["save_codes"]:
                    np.save(out / f"{result.id}.codes.npy", result.codes.astype(np.int64))
                seconds += result.duration
                ledger.write(_record(result.id, "ok", path=name, seconds=round(result.duration, 3),
                                     frames=result.frames, finish_reason=result.finish_reason, seed=seeds[result.id]))
                wall = time.time() - started
                progress.update(task, advance=1, rate=f"{seconds / wall:.2f}x realtime" if wall else "")
    console.print(f"done {len(todo) - (failed - len(bad))}, failed {failed}, skipped {skipped} (already done); "
                  f"{seconds:.1f} s of audio in {time.time() - started:.1f} s, into {out}")
    return failed


def _record(item_id, status, path=None, seconds=None, frames=None, finish_reason=None, seed=None, error=None):
    return {"id": item_id, "status": status, "path": path, "seconds": seconds, "frames": frames,
            "finish_reason": finish_reason or ("error" if status == "error" else None), "seed": seed, "error": error}


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
          retry_failed=False, audio_format="wav")


def main():
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
