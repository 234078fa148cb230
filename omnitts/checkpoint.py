"""A checkpoint loaded for one device: the loader's pure models, the device's preparation, the tokenizer.

`models/` knows checkpoints and tensors, `device/` knows hardware; this module is where they meet
(vLLM's split of model loading and `process_weights_after_loading`), so neither imports the other's
side: `models.loader.load_models` builds the networks as published, `device.prepare_weights` lays them
out for the device (on the CPU: packed weights, native kernels, Winograd convolutions).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ModelConfig
from .device import prepare_weights, stores_linears
from .device.features import resolve_dtype
from .errors import CheckpointError
from .io import user_path
from .models.codec import CodecDecoder
from .models.codec_encoder import CodecEncoder
from .models.loader import TTSModel, load_models
from .recipe import CODEC_DTYPES
from .text.tokenizer import TextTokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def load_checkpoint(path, device: str = "cpu", dtype: str = "auto", official_tokenizer: bool = False,
                    max_batch: int = 1, codec_dtype: str = "float32") -> Checkpoint:
    """Load checkpoint directory `path` for `device`. `dtype` applies to the LMs (`auto`: see
    device/features.py); `codec_dtype` (float32 or bfloat16) to the codec decoder; the speaker encoder
    and the codec's encoder stay float32. `max_batch`: the most rows an engine step will have (CPU
    weights are laid out for it, see `device/cpu_weights.layout_batch`). The loaded checkpoint keeps `path` absolute
    (its config's too): the voice identity and `info` read its files later, after a notebook may have changed folder."""
    path = user_path(path)
    dtype = resolve_dtype(dtype, device)
    if dtype not in DTYPES:
        raise CheckpointError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    if codec_dtype not in CODEC_DTYPES:
        raise CheckpointError(f"codec dtype {codec_dtype!r} is not one of {', '.join(CODEC_DTYPES)}")
    dev, lm_dtype, codec_torch_dtype = torch.device(device), DTYPES[dtype], DTYPES[codec_dtype]
    models = load_models(path, dev, lm_dtype, codec_torch_dtype, stored_linears=stores_linears(dev, lm_dtype))
    prepare_weights(models, dev, lm_dtype, codec_torch_dtype, max_batch)
    for module in (models.model, models.codec):
        module.eval().requires_grad_(False)  # the preparation may have swapped modules in
    tokenizer = TextTokenizer(path, official_tokenizer)
    models.config.path = path = path.absolute()
    return Checkpoint(path, models.config, models.model, models.codec, models.codec_encoder, tokenizer, dev, lm_dtype)
