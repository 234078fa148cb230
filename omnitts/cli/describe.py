"""`omnitts info`: a checkpoint's kind, size, voices, languages and sampling defaults, as a table or one JSON object
(omnitts.info reads them from the config files and safetensors headers)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import OmniTTSError
from .options import OUTPUT, fail, option, path, user_path


def info(model: Annotated[Path, typer.Argument(metavar="MODEL", show_default=False, callback=user_path, parser=path,
                                               help="Checkpoint directory.")],
         as_json: Annotated[bool, option("--json", panel=OUTPUT, help="Print one JSON object (the fields of "
                                                                      "TTS.info()) instead of the table.")] = False):
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
    if as_json:
        import json

        typer.echo(json.dumps({**d, "path": str(d["path"])}, ensure_ascii=False))
        return
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
