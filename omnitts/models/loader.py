"""Load the networks of a Qwen3-TTS-12Hz checkpoint directory as pure torch modules, fully offline.

Layout read (exactly as published):
  config.json, generation_config.json, model.safetensors (or model.safetensors.index.json + shards),
  vocab.json / merges.txt / tokenizer_config.json (text tokenizer),
  speech_tokenizer/{config.json, model.safetensors} (codec: `encoder.*` Mimi, `decoder.*` ours).

Loading is a strict name-for-name mapping: a missing, unexpected or mis-shaped tensor is one error
that names the file and the tensor. Modules are built on the meta device and the checkpoint's tensors
are assigned in, so a 1.7B checkpoint does not pay for a random initialisation it throws away.

The modules come out exactly as the checkpoint describes them (no fused projections, no packed
weights): a device prepares them afterwards (`omnitts.device.prepare_weights`, called by
`omnitts.checkpoint.load_checkpoint`). This package never imports `omnitts.device`.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..config import ModelConfig, load_config
from ..errors import CheckpointError
from ..io import broken_link
from .codec import CodecDecoder
from .codec_encoder import CodecEncoder
from .safetensors_io import MappedFile
from .speaker_encoder import SpeakerEncoder
from .talker import Talker


class TTSModel(nn.Module):
    """The networks in the checkpoint's `model.safetensors`: talker (+ predictor), speaker encoder."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.talker = Talker(cfg.talker, cfg.predictor)
        self.speaker_encoder = SpeakerEncoder(cfg.speaker_encoder) if cfg.speaker_encoder else None


@dataclass
class Models:
    """The networks of one checkpoint directory, loaded as published (before any device preparation)."""

    config: ModelConfig
    model: TTSModel
    codec: CodecDecoder
    codec_encoder: CodecEncoder | None  # Base checkpoints only (it encodes reference audio)


def safetensors_files(folder: Path, stem: str = "model") -> list[Path]:
    """The weight files of `folder`: `<stem>.safetensors`, or the shards its index lists."""
    single = folder / f"{stem}.safetensors"
    index = folder / f"{stem}.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{index}: unreadable shard index ({exc})") from None
        shards = [folder / name for name in sorted(set(weight_map.values()))]
        for shard in shards:
            if why := broken_link(shard):
                raise CheckpointError(f"{shard}: {why}")
            if not shard.is_file():
                raise CheckpointError(f"{shard}: file not found (listed in {index.name})")
        return shards
    for path in (single, index):
        if why := broken_link(path):
            raise CheckpointError(f"{path}: {why}")
    raise CheckpointError(f"{single}: file not found")


def open_files(files: list[Path]) -> dict[Path, MappedFile]:
    """Map every weight file once; a file that is not safetensors is one error naming it."""
    mapped = {}
    for path in files:
        try:
            mapped[path] = MappedFile(path)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    return mapped


def read_tensors(files: dict[Path, MappedFile], prefix: str = "") -> dict[str, tuple[MappedFile, str]]:
    """Map of tensor name (with `prefix` removed) -> (file, name in file), for names under `prefix`."""
    return {name[len(prefix):]: (f, name) for f in files.values() for name in f.keys() if name.startswith(prefix)}


def load_strict(module: nn.Module, files: dict[Path, MappedFile], prefix: str, dtype: torch.dtype, device,
                skip: tuple[str, ...] = (), keep_stored: tuple[str, ...] = ()) -> None:
    """Assign every parameter/buffer of `module` from `files` (names under `prefix`), checking all of it.

    Tensors already in `dtype` on the CPU stay views of the mapped file (no copy). Names in
    `keep_stored` keep a narrower stored float dtype instead of being widened to `dtype` (the
    module widens them after use, which is exact).
    """
    expected = module.state_dict(keep_vars=True)
    found = read_tensors(files, prefix)
    found = {k: v for k, v in found.items() if not k.startswith(skip)}
    where = ", ".join(str(f) for f in files)
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing:
        raise CheckpointError(f"{where}: missing tensor {prefix}{missing[0]}" + _more(missing))
    if unexpected:
        raise CheckpointError(f"{where}: unexpected tensor {prefix}{unexpected[0]}" + _more(unexpected)
                              + " (is this checkpoint of another kind or size than its config.json says?)")
    state = {}
    for name, ref in expected.items():
        mapped, key = found[name]
        shape = mapped.shape(key)
        if shape != tuple(ref.shape):
            raise CheckpointError(f"{mapped.path}: tensor {key} has shape {shape}, config.json implies {tuple(ref.shape)}")
        try:
            tensor = mapped.get(key)
        except ValueError as exc:
            raise CheckpointError(f"{mapped.path}: tensor {key} is unreadable ({exc})") from None
        target = dtype if tensor.is_floating_point() else tensor.dtype
        if name in keep_stored and tensor.is_floating_point() and tensor.dtype.itemsize < target.itemsize:
            target = tensor.dtype
        state[name] = tensor.to(device=device, dtype=target)
    module.load_state_dict(state, strict=True, assign=True)


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


def load_models(path: Path, device: torch.device, dtype: torch.dtype, codec_dtype: torch.dtype,
                stored_linears: bool = False) -> Models:
    """Load the networks of checkpoint directory `path` onto `device`: the talker (and code predictor) in
    `dtype`, the codec decoder in `codec_dtype`, the speaker encoder and codec encoder in float32.

    `stored_linears`: the talker's `nn.Linear` weights stay in their stored dtype (views of the mapped
    file on the CPU) for a device that widens and repacks them one at a time afterwards, so no second
    full copy of the model is ever made. The text embedding (151936 rows) is only gathered from: it
    always stays in its stored dtype and the talker widens the gathered rows (bfloat16 -> float32 is
    exact), saving ~1 GB and its conversion.
    """
    cfg = load_config(path)
    with torch.device("meta"), _no_init():
        model = TTSModel(cfg)
        codec = CodecDecoder(cfg.codec.decoder)
    weights = open_files(safetensors_files(path))
    linears = tuple(f"{name}.weight" for name, m in model.talker.named_modules() if type(m) is nn.Linear)
    load_strict(model.talker, weights, "talker.", dtype, device,
                keep_stored=("model.text_embedding.weight",) + (linears if stored_linears else ()))
    if model.speaker_encoder is not None:
        load_strict(model.speaker_encoder, weights, "speaker_encoder.", torch.float32, device)
    codec_files = open_files(safetensors_files(path / "speech_tokenizer"))
    load_strict(codec, codec_files, "decoder.", codec_dtype, device)
    encoder = None
    if cfg.model_type == "base":
        encoder = CodecEncoder(cfg.codec)
        load_strict(encoder.published_layout(), codec_files, "encoder.", torch.float32, device)
    _check_prefixes(weights, ("talker.", "speaker_encoder.") if model.speaker_encoder is not None else ("talker.",))
    for module in (model, codec, encoder):
        if module is not None:
            module.eval().requires_grad_(False)
    return Models(cfg, model, codec, encoder)


@contextlib.contextmanager
def _no_init():
    """Skip the random initialisation of modules built on the meta device (it only costs time:
    meta `normal_` imports torch's reference ops, ~2 s). Every tensor is then loaded."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_", "constant_", "trunc_normal_")
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _check_prefixes(files: dict[Path, MappedFile], allowed: tuple[str, ...]) -> None:
    """Tensors outside the parts we load mean a different model kind than config.json claims."""
    stray = sorted(k for k in read_tensors(files) if not k.startswith(allowed))
    if stray:
        raise CheckpointError(f"{next(iter(files))}: unexpected tensor {stray[0]}" + _more(stray)
                              + " (does tts_model_type in config.json match these weights?)")
