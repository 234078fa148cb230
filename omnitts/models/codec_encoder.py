"""The codec's encoder: reference audio -> 16 codes per 80 ms frame (voice cloning only).

It is a Mimi model (the official package subclasses `transformers.MimiModel` and drops its decoder
half), so we reuse transformers' implementation rather than rewriting it. Only its encoder weights
are in `speech_tokenizer/model.safetensors`, under the `encoder.` prefix, named as transformers 4.57
laid the model out (`encoder.layers.*`, `encoder_transformer.*`, `downsample.*`, `quantizer.*`: the
published layout).

transformers 5.21 split Mimi into an encoder and a decoder model: the same modules now sit under
`encoder.encoder_seanet.*`, `encoder.encoder_transformer.*` and `encoder.downsample.*`, the decoder
half is dropped through the config (`decoder_config=None`) and the old attributes became read-only
properties. `mimi_encoder` builds whichever layout the installed transformers has (found by testing
for the feature, not the version), and `published_layout` shows its modules under the published
names, so the checkpoint loads strictly, and is written, the same way on both.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ..config import CodecConfig

# Published name of each encoder-half module -> where a split Mimi (transformers >= 5.21) keeps it.
_SPLIT_LAYOUT = {
    "encoder": "encoder.encoder_seanet",
    "encoder_transformer": "encoder.encoder_transformer",
    "downsample": "encoder.downsample",
    "quantizer": "quantizer",
}


def mimi_encoder(encoder_config: dict) -> nn.Module:
    """A transformers `MimiModel` with only its encoder half, in the installed transformers' layout."""
    from transformers import MimiConfig, MimiModel

    config = MimiConfig(**encoder_config)
    if isinstance(getattr(MimiConfig, "decoder_config", None), property):  # split Mimi: drop the half by config
        config.decoder_config = None
        return MimiModel(config)
    mimi = MimiModel(config)  # one model: drop the decoder modules by hand
    mimi.upsample = mimi.decoder_transformer = mimi.decoder = None
    return mimi


def published_layout(mimi: nn.Module) -> nn.Module:
    """`mimi`'s encoder half under the published tensor names: the model itself where its layout is the
    published one, else a module whose children are `mimi`'s own (loading into it loads into `mimi`)."""
    if not isinstance(getattr(mimi, "encoder", None), nn.Module) or not hasattr(mimi.encoder, "encoder_seanet"):
        return mimi
    view = nn.Module()
    for name, where in _SPLIT_LAYOUT.items():
        view.add_module(name, mimi.get_submodule(where))
    return view


def code_frames(samples: int, cfg: CodecConfig) -> int:
    """The frames `CodecEncoder.encode` gives for `samples` samples at the codec's input rate: one per
    `encode_downsample_rate` samples begun (its codes are cut to that). validate counts a clip's frames by it."""
    return math.ceil(samples / cfg.encode_downsample_rate)


class CodecEncoder(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.cfg = cfg
        self.mimi = mimi_encoder(dict(cfg.encoder))

    def published_layout(self) -> nn.Module:
        """The module to load `speech_tokenizer/model.safetensors`' `encoder.*` tensors into."""
        return published_layout(self.mimi)

    @torch.inference_mode()
    def encode(self, wav: np.ndarray) -> torch.Tensor:
        """Mono waveform at the codec's input rate -> codes (frames, 16), int64, on CPU."""
        weight = next(self.mimi.parameters())
        x = torch.from_numpy(np.asarray(wav, dtype=np.float32))[None, None].to(weight.device, weight.dtype)
        codes = self.mimi.encode(x, return_dict=True).audio_codes  # (1, n_q, frames)
        frames = code_frames(x.shape[-1], self.cfg)
        return codes[0, : self.cfg.encoder_valid_num_quantizers, :frames].transpose(0, 1).long().cpu()
