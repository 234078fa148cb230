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

import contextlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..config import ModelConfig, load_config
from ..device.cpu_weights import (PackedLinear, Widener, can_pack, channels_last_units, narrow_convs, pack_convs,
                                  pack_linears, pack_transposed_convs, use_cpu_attention, use_native_norms,
                                  use_native_rope, use_native_snakes, use_native_swiglu, winograd_convs)
from ..device.features import resolve_dtype
from ..device.hugepages import HugePageArena
from ..errors import CheckpointError
from ..recipe import CODEC_DTYPES
from ..tokenizer import TextTokenizer
from .codec import CodecDecoder
from .codec_encoder import CodecEncoder
from .layers import fuse_projections
from .safetensors_io import MappedFile
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

    @property
    def cache_dtype(self) -> torch.dtype:
        """The dtype an engine keeps the talker K/V cache in (wider than `dtype` for bfloat16 on the CPU)."""
        return self.model.talker.model.kv_dtype or self.dtype


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


def open_files(files: list[Path]) -> dict[Path, MappedFile]:
    """Map every weight file once; a file that is not safetensors is one error naming it."""
    mapped = {}
    for path in files:
        try:
            mapped[path] = MappedFile(path)
        except (OSError, ValueError, struct.error) as exc:
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


def load_checkpoint(path, device: str = "cpu", dtype: str = "auto", official_tokenizer: bool = False,
                    max_batch: int = 1, codec_dtype: str = "float32") -> Checkpoint:
    """Load checkpoint directory `path`. `dtype` applies to the LMs (`auto`: see device/features.py);
    `codec_dtype` (float32 or bfloat16) to the codec decoder; the speaker encoder and the codec's
    encoder stay float32. `max_batch`: the most rows an engine step will have (CPU weights are laid
    out for it, see `cpu_weights.layout_batch`)."""
    path = Path(path).expanduser()
    dtype = resolve_dtype(dtype, device)
    if dtype not in DTYPES:
        raise CheckpointError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    if codec_dtype not in CODEC_DTYPES:
        raise CheckpointError(f"codec dtype {codec_dtype!r} is not one of {', '.join(CODEC_DTYPES)}")
    cfg = load_config(path)
    dev = torch.device(device)
    lm_dtype = DTYPES[dtype]
    with torch.device("meta"), _no_init():
        model = TTSModel(cfg)
        codec = CodecDecoder(cfg.codec.decoder)
    weights = open_files(safetensors_files(path))
    # The text embedding (151936 rows) is only gathered from: it stays in its stored dtype and the
    # talker widens the gathered rows (bfloat16 -> float32 is exact), saving ~1 GB and its conversion.
    # On the CPU, linear weights stay views of the file until `pack_linears` widens and packs them
    # one at a time (each temporary is freed before the next: no second full copy of the model).
    packing = dev.type == "cpu" and can_pack(lm_dtype)
    linears = tuple(f"{name}.weight" for name, m in model.talker.named_modules() if type(m) is nn.Linear)
    load_strict(model.talker, weights, "talker.", lm_dtype, dev,
                keep_stored=("model.text_embedding.weight",) + (linears if packing else ()))
    # q/k/v and gate/up projections merged: fewer, larger matrix products and one q/k norm and rotation.
    if packing:
        # Packed weights on huge pages: every batch-1 step streams them all (see device/hugepages.py).
        widen, arena = Widener(), HugePageArena()
        fuse_projections(model.talker, lambda parts: PackedLinear(parts, lm_dtype, max_batch, widen, arena))
        pack_linears(model.talker, lm_dtype, max_batch, widen, arena)
        use_native_norms(model.talker, lm_dtype)
        use_native_rope(model.talker, lm_dtype)
        use_native_swiglu(model.talker, lm_dtype)
    else:
        fuse_projections(model.talker)
    # The CPU attends in float32, bfloat16 models included (torch's bfloat16 CPU kernel is the slow one):
    # omnitts' kernel reads a bfloat16 K/V history as stored; torch's fallback gets a float32 history
    # (`cache_dtype`), so the whole history is never re-widened at each step.
    if dev.type == "cpu":
        use_cpu_attention(model.talker)
    if model.speaker_encoder is not None:
        load_strict(model.speaker_encoder, weights, "speaker_encoder.", torch.float32, dev)
    codec_files = open_files(safetensors_files(path / "speech_tokenizer"))
    load_strict(codec, codec_files, "decoder.", DTYPES[codec_dtype], dev)
    fuse_projections(codec)
    if dev.type == "cpu":
        # float32 runs are the parity runs: their codec keeps the direct convolutions and torch's sine
        # (Winograd's rounding moves the waveform by ~1e-4 of its peak; see cpu_weights.WinogradConv1d).
        parity = lm_dtype == torch.float32
        winograd_convs(codec, parity=parity)
        narrow_convs(codec, parity=parity)
        channels_last_units(codec)
        pack_transposed_convs(codec)
        pack_convs(codec)
        use_native_snakes(codec, DTYPES[codec_dtype], parity=parity)
    encoder = None
    if cfg.model_type == "base":
        encoder = CodecEncoder(cfg.codec)
        load_strict(encoder.published_layout(), codec_files, "encoder.", torch.float32, dev)
    _check_prefixes(weights, ("talker.", "speaker_encoder.") if model.speaker_encoder is not None else ("talker.",))
    for module in (model, codec, encoder):
        if module is not None:
            module.eval().requires_grad_(False)
    return Checkpoint(path, cfg, model, codec, encoder, TextTokenizer(path, official_tokenizer), dev, lm_dtype)


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
