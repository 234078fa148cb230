"""What a checkpoint is, for people: kind, size, parameter counts, voices, languages and defaults.

Parameter counts come from the safetensors headers (names, dtypes and shapes), so describing a
checkpoint reads a few kilobytes and loads no weights. Used by `TTS.info()` and `omnitts info`.
"""

from __future__ import annotations

from dataclasses import asdict
from math import prod
from pathlib import Path

from .config import ModelConfig, config_summary, load_config
from .errors import CheckpointError
from .models.safetensors_io import read_header
from .params import SamplingParams


def read_shapes(files: list[Path]) -> dict[str, list[int]]:
    """Tensor name -> shape for every tensor in safetensors `files`, read from their headers only."""
    shapes = {}
    for path in files:
        try:
            header, _ = read_header(path)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
        shapes.update((name, entry["shape"]) for name, entry in header.items())
    return shapes


def count_parameters(files: list[Path]) -> int:
    """Total number of tensor elements in safetensors `files`, read from their headers only."""
    return sum(prod(shape) for shape in read_shapes(files).values())


# The published talkers' shapes: (hidden size, decoder layers, FFN size) -> size name.
PUBLISHED_SIZES = {(1024, 28, 3072): "0.6B", (2048, 28, 6144): "1.7B"}
TINY_PARAMETERS = 100_000_000  # the smallest published checkpoint holds ~0.9B; test checkpoints ~10M


def size_from_shapes(shapes: dict[str, list[int]]) -> str:
    """The size a checkpoint really has, from its talker's tensor shapes (not the name in its config).

    "0.6B" / "1.7B" where the talker's (hidden, layers, FFN) are a published checkpoint's; otherwise
    "tiny" under 100M parameters (the test and demo checkpoints), else "custom".
    """
    prefix = "talker.model.layers."
    layers = {name[len(prefix):].split(".", 1)[0] for name in shapes if name.startswith(prefix)}
    hidden = shapes.get("talker.model.codec_embedding.weight", [0, 0])[-1]
    ffn = shapes.get(prefix + "0.mlp.gate_proj.weight", [0])[0]
    if (hidden, len(layers), ffn) in PUBLISHED_SIZES:
        return PUBLISHED_SIZES[hidden, len(layers), ffn]
    return "tiny" if sum(prod(shape) for shape in shapes.values()) < TINY_PARAMETERS else "custom"


def size_label(model_size: str) -> str:
    """The checkpoint's size name as people write it: "0b6" -> "0.6B", "1b7" -> "1.7B"."""
    whole, _, fraction = model_size.lower().partition("b")
    if whole.isdigit() and fraction.isdigit():
        return f"{whole}.{fraction}B"
    return model_size or "unknown"


def short_count(n: int) -> str:
    """A parameter count in a few characters: 906_123_456 -> "906.1M", 1_912_000_000 -> "1.91B"."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}" if unit == "B" else f"{n / scale:.1f}{unit}"
    return str(n)


def checkpoint_info(path, cfg: ModelConfig | None = None) -> dict:
    """Describe checkpoint directory `path` (config and safetensors headers only; no weights loaded).

    Returns a dict with: `path`; `kind` (custom_voice | voice_design | base); `size` (from the
    tensor shapes: "0.6B", "1.7B", "tiny" or "custom", see `size_from_shapes`); `config_size` (the
    size the config names, "0.6B" / "1.7B": it decides behaviour such as dropping instructions);
    `parameters` (elements of model.safetensors: talker, code predictor, speaker encoder) and
    `codec_parameters` (speech_tokenizer/); `talker_hidden`, `talker_layers`, `predictor_layers`,
    `code_groups`; `speakers` (CustomVoice; empty otherwise) and `dialects` (speaker -> the dialect
    it speaks for chinese/auto); `languages` ("auto" first); `accepts_instruct`; `sample_rate` (Hz);
    `frame_rate` (codec frames per second); `sampling` (default sampling parameters from
    generation_config.json) and `max_frames` (the frame cap per request).
    """
    from .models.loader import safetensors_files

    path = Path(path)
    cfg = cfg or load_config(path)
    shapes = read_shapes(safetensors_files(path))
    summary = config_summary(cfg)
    defaults = SamplingParams.from_generation_config(cfg.generation)
    sampling = {k: v for k, v in asdict(defaults).items() if k not in ("max_frames", "seed", "frame_cap")}
    dialects = {name: str(d) for name, d in cfg.talker.spk_is_dialect.items() if d and name in cfg.talker.spk_id}
    return {
        "path": str(path),
        "kind": summary["kind"],
        "size": size_from_shapes(shapes),
        "config_size": size_label(cfg.model_size),
        "parameters": sum(prod(shape) for shape in shapes.values()),
        "codec_parameters": count_parameters(safetensors_files(path / "speech_tokenizer")),
        **{k: summary[k] for k in ("talker_hidden", "talker_layers", "predictor_layers", "code_groups")},
        "speakers": summary["speakers"],
        "dialects": dialects,
        "languages": summary["languages"],
        "accepts_instruct": summary["accepts_instruct"],
        "sample_rate": summary["sample_rate"],
        "frame_rate": summary["sample_rate"] / cfg.codec.decode_upsample_rate,
        "sampling": sampling,
        "max_frames": defaults.frame_cap,
    }
