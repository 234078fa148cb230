"""`omnitts voice-clone`: a voice cloned from a reference clip, saved as a voice file, spoken at once, or both."""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import OmniTTSError
from .checks import check_engine, check_out_apart, check_output, checkpoint_config, names_audio_file, show_log
from .options import (
    INPUT,
    OUTPUT,
    CodecDtype,
    Device,
    Dtype,
    Format,
    Greedy,
    Model,
    OfficialTok,
    TextMaxFrames,
    TextSeed,
    fail,
    option,
    path,
    user_path,
    warnings_as_lines,
)


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
    max_frames: TextMaxFrames = None,
    seed: TextSeed = None,
    dtype: Dtype = "auto",
    codec_dtype: CodecDtype = "float32",
    device: Device = "cpu",
    official_tokenizer: OfficialTok = False,
    save: Annotated[Optional[Path], option("--save", callback=user_path, parser=path, panel=OUTPUT, metavar="FILE",
                                            help="Write the voice to this .safetensors file (an earlier voice file "
                                                 "there is replaced).")] = None,
    out: Annotated[Optional[Path], option("--out", "-o", callback=user_path, parser=path, panel=OUTPUT, metavar="DIR",
                                           help="Output directory for --text: OUT/ID.wav (replaced if it exists: "
                                                "--id names another).")] = None,
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
    from ..errors import RequestError
    from ..io.audio import load_reference
    from ..request import Request
    from ..text import no_transcript
    from ..text.prompt import not_text, resolve
    from ..voice import check_replaceable

    show_log(False)
    check_engine(dict(device=device, dtype=dtype, codec_dtype=codec_dtype), has_devices=False)
    audio_format = check_output(audio_format, None)
    if save is None and text is None and out is None:
        fail("nothing to do: give --save VOICE.safetensors, or --text \"...\" -o DIR, or both")
    if (text is None) != (out is None):
        fail("--text and -o go together: -o names the directory --text is spoken into (OUT/ID.wav)")
    if text is None and (given := [flag for name, flag in _SPEAKING_FLAGS if _given(ctx, name)]):
        fail(f"{given[0]} goes with --text \"...\" -o DIR (it is for the spoken audio); --save alone speaks nothing")
    if out is not None and names_audio_file(out):
        fail(f"-o {out}: -o is the output directory, as in synth; write -o {out.parent} --id {out.stem}"
              f"{'' if out.suffix.lower() == '.wav' else ' --format ' + out.suffix.lower().lstrip('.')}")
    if out is not None:
        _check_clone_out(out)
        check_out_apart(out, model, "-o")
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
    if not x_vector_only and no_transcript(ref_text):
        fail("--ref-text is required for in-context cloning; give the reference transcript, "
              "or use --x-vector-only")
    if ref_text and (problem := not_text(ref_text)):  # bytes that are not UTF-8 arrive as lone surrogates
        fail(f"--ref-text: {problem}")
    made: list[Path] = []  # the folders of -o made here: removed again, where still empty, if the command fails
    try:
        cfg = checkpoint_config(model)
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
            with warnings_as_lines():  # a --max-frames past the checkpoint's frame cap
                result = tts.synthesize(text, language=language, voice=voice, greedy=greedy, max_frames=max_frames,
                                        seed=seed)
            path = result.save(out / f"{item_id}.{audio_format}")
            seeded = "" if result.seed is None else f"; seed {result.seed}"  # None: greedy, nothing drawn
            ended = "ended by the model" if result.finish_reason == "eos" else "cut at the frame budget"
            typer.echo(f"wrote {path} ({result.duration:.2f} s, {result.frames} frames, {ended}; {mode} voice{seeded})")
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
    from ..batch.folder import check_out

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
