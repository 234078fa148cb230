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
Dtype = Annotated[Optional[str], typer.Option("--dtype", help="float32 | bfloat16 | float16 (language models; codec stays float32). [default: float32]", show_default=False)]
Device = Annotated[Optional[str], typer.Option("--device", help="cpu | cuda | npu (npu needs torch_npu and CANN). [default: cpu]", show_default=False)]
MaxBatch = Annotated[Optional[int], typer.Option("--max-batch", min=1, help="Requests decoded together (continuous batching). [default: 8]", show_default=False)]
Eager = Annotated[Optional[bool], typer.Option("--eager/--no-eager", help="No graph capture on cuda/npu (also OMNITTS_EAGER=1). [default: no-eager]", show_default=False)]
RecipeOpt = Annotated[Optional[Path], typer.Option("--recipe", "-r", help="TOML engine settings (recipes/*.toml); flags given on the command line win.")]

ENGINE_DEFAULTS = dict(device="cpu", dtype="float32", max_batch=8, eager=False)
SaveCodes = Annotated[bool, typer.Option("--save-codes", help="Also write ID.codes.npy, int64 [frames, 16].")]
OfficialTok = Annotated[bool, typer.Option("--official-tokenizer", help="Tokenize like the official qwen-tts package (Mistral regex swap) instead of as the checkpoint defines.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
Strict = Annotated[bool, typer.Option("--strict", help="Stop before synthesis if any manifest line is bad.")]
RetryFailed = Annotated[bool, typer.Option("--retry-failed", help="Also retry items that failed in an earlier run.")]
Format = Annotated[str, typer.Option("--format", help="Audio format of the outputs: wav | flac | ogg.")]


def _fail(message: str, code: int = 2):
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


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
    manifest: Annotated[Path, typer.Argument(help="JSONL manifest: one {id, text, language, speaker | instruct | ref_audio ...} per line.")],
    model: Model,
    out: Out,
    greedy: Greedy = False,
    max_frames: MaxFrames = None,
    seed: Seed = None,
    dtype: Dtype = None,
    device: Device = None,
    save_codes: SaveCodes = False,
    official_tokenizer: OfficialTok = False,
    quiet: Quiet = False,
    max_batch: MaxBatch = None,
    eager: Eager = None,
    strict: Strict = False,
    retry_failed: RetryFailed = False,
    audio_format: Format = "wav",
    recipe: RecipeOpt = None,
):
    """Synthesize every line of MANIFEST into OUT/ID.wav, recording each in OUT/results.jsonl.

    Bad lines are reported (file:line: field: problem) and recorded as errors while the rest run;
    re-running the same command skips what is done. Exit code 1 if any item failed. Engine
    settings come from the flags, else from --recipe, else the defaults shown.
    """
    try:
        engine = _engine_options(recipe, device=device, dtype=dtype, max_batch=max_batch, eager=eager)
    except OmniTTSError as exc:
        _fail(str(exc))
    device = engine["device"]

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
    settings = dict(greedy=greedy, max_frames=max_frames, seed=seed, save_codes=save_codes, format=audio_format)
    try:
        failed = _run(items, bad, model, out, settings, quiet, retry_failed,
                      dict(engine, official_tokenizer=official_tokenizer))
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
    synth(manifest, model_dir, out, greedy=True, max_frames=25, seed=0, dtype=None, device=None,
          save_codes=True, official_tokenizer=False, quiet=False, max_batch=None, eager=None, strict=False,
          retry_failed=False, audio_format="wav", recipe=None)


def _write_demo_reference(path: Path) -> None:
    """A 1.5 s voice-like reference clip (a gliding harmonic tone with a syllable rhythm), 16 kHz."""
    import numpy as np

    from .audio import write_audio

    rate = 16000
    t = np.arange(int(rate * 1.5)) / rate
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.5 * (1 - np.cos(2 * np.pi * 4 * t)) * np.minimum(1, 10 * t) * np.minimum(1, 10 * (1.5 - t))
    write_audio(path, (0.25 * voice * envelope).astype(np.float32), rate)


def main():
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
