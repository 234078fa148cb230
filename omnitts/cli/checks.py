"""The checks every command makes before anything loads (device, dtypes, output format), and where the
library's log lines go."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from ..errors import OmniTTSError
from .options import either, fail


class LogToStderr(logging.Handler):
    """The "omnitts" logger's lines on stderr, as they are (`typer.echo` finds the current stderr)."""

    def emit(self, record: logging.LogRecord) -> None:
        typer.echo(self.format(record), err=True)


LOG_HANDLER = LogToStderr()


def show_log(quiet: bool) -> None:
    """Show the library's INFO notes (such as the one-time kernel build) unless `quiet`; warnings always."""
    logger = logging.getLogger("omnitts")
    if LOG_HANDLER not in logger.handlers:
        logger.addHandler(LOG_HANDLER)
    LOG_HANDLER.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.setLevel(logging.INFO)


def check_engine(engine: dict, devices: str | None = None, recipe: Path | None = None,
                 has_devices: bool = True) -> None:
    """Reject a bad device, dtype or codec dtype (and a device this machine lacks) before anything loads;
    `devices`: the --devices list the device kind came from, named in the error instead of --device; `recipe`:
    the recipe it came from (no --device given), named instead (`--device cuda` was never typed); `has_devices`:
    the command takes --devices (synth), which is how one picks a device by its index."""
    from ..recipe import CODEC_DTYPES, DEVICES, DTYPES, VISIBLE, device_index

    if one := device_index(engine["device"]):  # torch's name of one device ("choose cpu, cuda or npu" said)
        kind, index = one
        how = f"--devices {engine['device']}, or " if has_devices else ""
        fail(f"--device {engine['device']!r}: give the kind, {kind!r}; to run on device {index}: {how}"
             f"{VISIBLE[kind]}={index} before the command with --device {kind}")
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


def check_output(audio_format: str, loudness: float | None) -> str:
    """The audio format as files are named (`FLAC` and `.flac` are `flac`); fails on a bad format or level."""
    from ..io.audio import FORMATS

    kind = audio_format.strip().lower().removeprefix(".")
    if kind not in FORMATS:
        fail(f"--format {audio_format!r}: choose {either(tuple(FORMATS))}")
    if loudness is not None and not -70.0 <= loudness <= 0.0:
        fail(f"--loudness {loudness:g}: choose a level from -70 to 0 LUFS (e.g. -23 or -16)")
    return kind


def check_out_apart(out: Path, model: Path, flag: str = "--out") -> None:
    """Refuse an output directory that is the checkpoint directory or its codec's folder (-o and -m mixed up):
    the audio and results.jsonl would be written among the weights. A folder of its own inside one is fine."""
    try:
        out_at, model_at = out.resolve(), model.resolve()
    except (OSError, RuntimeError):  # (a loop of links: refused where the path is used)
        return
    if out_at in (model_at, model_at / "speech_tokenizer"):
        what = "the checkpoint directory" if out_at == model_at else f"the codec folder of checkpoint {model}"
        fail(f"{flag} {out}: is {what}; write the outputs to a folder of their own")
