"""The codec's encoder: reference audio -> 16 codes per 80 ms frame (voice cloning only).

It is a Mimi model (the official package subclasses `transformers.MimiModel` and drops its decoder
half), so we reuse transformers' implementation rather than rewriting it: only its encoder weights
are in `speech_tokenizer/model.safetensors`, under the `encoder.` prefix.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ..config import CodecConfig


class CodecEncoder(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        from transformers import MimiConfig, MimiModel

        self.cfg = cfg
        self.mimi = MimiModel(MimiConfig(**cfg.encoder))
        # The decoder half of Mimi is not in the checkpoint (our own CodecDecoder replaces it).
        # transformers 4.57's module layout is the checkpoint's (`encoder.encoder.*`, `encoder.quantizer.*`).
        self.mimi.upsample = None
        self.mimi.decoder_transformer = None
        self.mimi.decoder = None

    @torch.inference_mode()
    def encode(self, wav: np.ndarray) -> torch.Tensor:
        """Mono waveform at the codec's input rate -> codes (frames, 16), int64, on CPU."""
        weight = next(self.mimi.parameters())
        x = torch.from_numpy(np.asarray(wav, dtype=np.float32))[None, None].to(weight.device, weight.dtype)
        codes = self.mimi.encode(x, return_dict=True).audio_codes  # (1, n_q, frames)
        frames = math.ceil(x.shape[-1] / self.cfg.encode_downsample_rate)
        return codes[0, : self.cfg.encoder_valid_num_quantizers, :frames].transpose(0, 1).long().cpu()
