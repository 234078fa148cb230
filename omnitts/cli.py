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
):
    """Synthesize every line of MANIFEST into OUT/<id>.wav."""
    from .config import load_config
    from .manifest import ManifestError, load_manifest

    if device not in ("cpu", "cuda", "npu"):
        _fail(f"--device {device!r}: choose cpu, cuda or npu")
    try:
        items = load_manifest(manifest, load_config(model))
    except ManifestError as exc:
        for line in exc.errors:
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2)
    except OmniTTSError as exc:
        _fail(str(exc))
    try:
        _run(items, model, out, greedy, max_frames, seed, dtype, device, save_codes, official_tokenizer, quiet,
             max_batch, eager)
    except OmniTTSError as exc:
        _fail(str(exc))


def _run(items, model, out, greedy, max_frames, seed, dtype, device, save_codes, official_tokenizer, quiet,
         max_batch=8, eager=False):
    import numpy as np
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .api import load

    console = Console(stderr=True, quiet=quiet)
    with console.status("loading checkpoint"):
        tts = load(model, device=device, dtype=dtype, official_tokenizer=official_tokenizer, max_batch=max_batch,
                   eager=eager)
    out.mkdir(parents=True, exist_ok=True)
    total_seconds = 0.0
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=quiet) as progress:
        task = progress.add_task("synthesizing", total=len(items))
        jobs = [(item.request, tts.default_params(greedy, max_frames=max_frames,
                                                  seed=item.seed if item.seed is not None else seed))
                for item in items]
        for result in tts.generate(jobs):
            result.save(out / f"{result.id}.wav")
            if save_codes:
                np.save(out / f"{result.id}.codes.npy", result.codes.astype(np.int64))
            total_seconds += result.duration
            progress.advance(task)
    console.print(f"wrote {len(items)} file(s), {total_seconds:.1f} s of audio, to {out}")


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
          save_codes=True, official_tokenizer=False, quiet=False, max_batch=8, eager=False)


def main():
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
