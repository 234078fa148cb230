"""Load a Qwen3-TTS-12Hz checkpoint directory into omnitts modules, fully offline.

Layout read (exactly as published):
  config.json, generation_config.json, model.safetensors (or model.safetensors.index.json + shards),
  vocab.json / merges.txt / tokenizer_config.json (text tokenizer),
  speech_tokenizer/{config.json, model.safetensors} (codec: `encoder.*` Mimi, `decoder.*` ours).

Loading is a strict name-for-name mapping: a missing, unexpected or mis-shaped tensor is one error
that names the file and the tensor. Modules are built on the meta device and the checkpoint's tensors
are assigned in, so a 1.7B checkpoint does not pay for a random initialisation it throws away.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..config import ModelConfig, load_config
from ..errors import CheckpointError
from ..tokenizer import TextTokenizer
from .codec import CodecDecoder
from .codec_encoder import CodecEncoder
from .speaker_encoder import SpeakerEncoder
from .talker import Talker

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TTSModel(nn.Module):
    """The networks in the checkpoint's `model.safetensors`: talker (+ predictor), speaker encoder."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.talker = Talker(cfg.talker, cfg.predictor)
        self.speaker_encoder = SpeakerEncoder(cfg.speaker_encoder) if cfg.speaker_encoder else None


@dataclass
class Checkpoint:
    """Everything one checkpoint directory provides, loaded and ready to run."""

    path: Path
    config: ModelConfig
    model: TTSModel
    codec: CodecDecoder
    codec_encoder: CodecEncoder | None  # Base checkpoints only (it encodes reference audio)
    tokenizer: TextTokenizer
    device: torch.device
    dtype: torch.dtype


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
            if not shard.is_file():
                raise CheckpointError(f"{shard}: file not found (listed in {index.name})")
        return shards
    raise CheckpointError(f"{single}: file not found")


def read_tensors(files: list[Path], prefix: str = "") -> dict[str, tuple[Path, str]]:
    """Map of tensor name (with `prefix` removed) -> (file, name in file), for names under `prefix`."""
    from safetensors import safe_open

    found = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if name.startswith(prefix):
                        found[name[len(prefix):]] = (path, name)
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    return found


def load_strict(module: nn.Module, files: list[Path], prefix: str, dtype: torch.dtype, device,
                skip: tuple[str, ...] = ()) -> None:
    """Assign every parameter/buffer of `module` from `files` (names under `prefix`), checking all of it."""
    from safetensors import safe_open

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
    handles = {path: safe_open(str(path), framework="pt") for path in files}
    for name, ref in expected.items():
        path, key = found[name]
        tensor = handles[path].get_tensor(key)
        if tuple(tensor.shape) != tuple(ref.shape):
            raise CheckpointError(f"{path}: tensor {key} has shape {tuple(tensor.shape)}, "
                                  f"config.json implies {tuple(ref.shape)}")
        target = dtype if tensor.is_floating_point() else tensor.dtype
        state[name] = tensor.to(device=device, dtype=target)
    module.load_state_dict(state, strict=True, assign=True)


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


def load_checkpoint(path, device: str = "cpu", dtype: str = "float32", official_tokenizer: bool = False) -> Checkpoint:
    """Load checkpoint directory `path`. `dtype` applies to the LMs; codec and speaker encoder stay float32."""
    path = Path(path).expanduser()
    if dtype not in DTYPES:
        raise CheckpointError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    cfg = load_config(path)
    dev = torch.device(device)
    lm_dtype = DTYPES[dtype]
    with torch.device("meta"):
        model = TTSModel(cfg)
        codec = CodecDecoder(cfg.codec.decoder)
    weights = safetensors_files(path)
    load_strict(model.talker, weights, "talker.", lm_dtype, dev)
    if model.speaker_encoder is not None:
        load_strict(model.speaker_encoder, weights, "speaker_encoder.", torch.float32, dev)
    codec_files = safetensors_files(path / "speech_tokenizer")
    load_strict(codec, codec_files, "decoder.", torch.float32, dev)
    encoder = None
    if cfg.model_type == "base":
        encoder = CodecEncoder(cfg.codec)
        load_strict(encoder.mimi, codec_files, "encoder.", torch.float32, dev)
    _check_prefixes(weights, ("talker.", "speaker_encoder.") if model.speaker_encoder is not None else ("talker.",))
    for module in (model, codec, encoder):
        if module is not None:
            module.eval().requires_grad_(False)
    return Checkpoint(path, cfg, model, codec, encoder, TextTokenizer(path, official_tokenizer), dev, lm_dtype)


def _check_prefixes(files: list[Path], allowed: tuple[str, ...]) -> None:
    """Tensors outside the parts we load mean a different model kind than config.json claims."""
    stray = sorted(k for k in read_tensors(files) if not k.startswith(allowed))
    if stray:
        raise CheckpointError(f"{files[0]}: unexpected tensor {stray[0]}" + _more(stray)
                              + " (does tts_model_type in config.json match these weights?)")
