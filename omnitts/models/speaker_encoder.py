"""ECAPA-TDNN speaker encoder (Base checkpoints): 24 kHz waveform -> x-vector of talker-hidden size.

Input features are a 128-bin log-mel spectrogram (n_fft 1024, hop 256, Slaney mel filters from
librosa, reflect padding, magnitude with a 1e-9 floor, log with a 1e-5 clamp), as the reference
computes them. Parameter names follow the checkpoint's `speaker_encoder.` tensors.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..config import SpeakerEncoderConfig


def log_mel(wav: torch.Tensor, sample_rate: int = 24000, n_fft: int = 1024, hop: int = 256,
            n_mels: int = 128, fmin: float = 0.0, fmax: float = 12000.0) -> torch.Tensor:
    """wav (B, T) float in [-1, 1] -> log-mel (B, n_mels, frames)."""
    from librosa.filters import mel as mel_filters  # librosa is slow to import; only Base needs it

    basis = torch.from_numpy(mel_filters(sr=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax))
    pad = (n_fft - hop) // 2
    wav = torch.nn.functional.pad(wav.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spec = torch.stft(wav, n_fft, hop_length=hop, win_length=n_fft, window=torch.hann_window(n_fft),
                      center=False, normalized=False, onesided=True, return_complex=True)
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(basis.float() @ magnitude, min=1e-5))


def _conv(cin, cout, kernel, dilation=1):
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    def __init__(self, cin, cout, kernel, dilation):
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)

    def forward(self, x):
        return torch.relu(self.conv(x))


class Res2Net(nn.Module):
    """Split channels into `scale` groups; each group after the first adds the previous group's output."""

    def __init__(self, channels, scale, kernel, dilation):
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(TDNN(channels // scale, channels // scale, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x):
        parts = list(torch.chunk(x, self.scale, dim=1))
        out = [parts[0]]
        for i in range(1, self.scale):
            inp = parts[i] if i == 1 else parts[i] + out[-1]
            out.append(self.blocks[i - 1](inp))
        return torch.cat(out, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels, se_channels):
        super().__init__()
        self.conv1 = _conv(channels, se_channels, 1)
        self.conv2 = _conv(se_channels, channels, 1)

    def forward(self, x):
        s = torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))
        return x * torch.sigmoid(self.conv2(s))


class SERes2NetBlock(nn.Module):
    def __init__(self, cin, cout, scale, se_channels, kernel, dilation):
        super().__init__()
        self.tdnn1 = TDNN(cin, cout, 1, 1)
        self.res2net_block = Res2Net(cout, scale, kernel, dilation)
        self.tdnn2 = TDNN(cout, cout, 1, 1)
        self.se_block = SqueezeExcitation(cout, se_channels)

    def forward(self, x):
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatsPooling(nn.Module):
    """Attention-weighted mean and std over time, the attention seeing global mean/std as context."""

    def __init__(self, channels, attention_channels):
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels, 1)

    @staticmethod
    def _stats(x, weights):
        mean = (weights * x).sum(2)
        std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def forward(self, x):  # (B, C, T) -> (B, 2C, 1)
        t = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, t), 1.0 / t, dtype=x.dtype, device=x.device)
        mean, std = self._stats(x, uniform)
        context = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, t), std.unsqueeze(2).expand(-1, -1, t)], dim=1)
        weights = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, weights)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        self.cfg = cfg
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        self.blocks = nn.ModuleList([TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i]))
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPooling(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim, 1)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """mels (B, n_mels, frames) -> x-vectors (B, enc_dim)."""
        x, outputs = mels, []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.mfa(torch.cat(outputs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, wav: np.ndarray) -> torch.Tensor:
        """One 24 kHz mono waveform -> its x-vector (enc_dim,)."""
        weight = self.fc.weight
        mels = log_mel(torch.from_numpy(np.asarray(wav, dtype=np.float32))[None], self.cfg.sample_rate)
        return self(mels.to(weight.device, weight.dtype))[0]
