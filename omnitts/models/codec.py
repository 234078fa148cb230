"""The 12 Hz codec decoder: 16 codes per frame -> 1920 samples of 24 kHz audio.

RVQ decode -> causal conv -> sliding-window causal transformer -> 2x (transposed conv + ConvNeXt)
-> causal conv -> 4 upsampling blocks (SnakeBeta, transposed conv, dilated residual units) -> waveform.
Everything is causal, which is what makes exact streaming decode possible later. Runs in float32 by
default, or in bfloat16 when loaded so (`load_checkpoint(codec_dtype=...)`).
Parameter names follow `speech_tokenizer/model.safetensors` (under its `decoder.` prefix).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import CodecDecoderConfig
from .layers import Attention, GatedMLP, RMSNorm, rope_cos_sin


class CausalConv(nn.Module):
    """Conv1d padded on the left only (plus the right padding a strided conv needs to cover the input)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, stride: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.span = (kernel - 1) * dilation + 1
        self.left = self.span - stride

    def forward(self, x):
        length = x.shape[-1]
        frames = math.ceil((length - self.span + self.left) / self.stride + 1)
        right = (frames - 1) * self.stride + (self.span - self.left) - length
        return self.conv(F.pad(x, (self.left, right)))


class CausalTransConv(nn.Module):
    """ConvTranspose1d whose tail (kernel - stride samples) is trimmed so output = input * stride."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x):
        x = self.conv(x)
        return x[..., : x.shape[-1] - self.trim] if self.trim > 0 else x


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x):  # (B, C, T)
        h = self.norm(self.dwconv(x).transpose(1, 2))
        h = self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + (self.gamma * h).transpose(1, 2)


class SnakeBeta(nn.Module):
    """x + 1/exp(beta) * sin^2(x * exp(alpha)), per channel (log-scale parameters)."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))
        # `kernel(x, alpha, inv_beta)`: the same arithmetic fused, where a device layer provides one
        # (device/cpu_weights.use_native_snakes); used for inputs of the parameters' dtype.
        self.kernel = None
        self._coefficients: tuple | None = None  # (key of the parameters they were made from, (alpha, inv_beta))

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(alpha, inv_beta) per channel, as the formula takes them: exp(alpha), 1 / (exp(beta) + 1e-9).

        Made once and kept while the parameters stay the same tensors, unmodified (a load or `.to` makes
        new ones; an in-place change bumps their version): four small kernels fewer per call, ~30 calls
        per codec step (on a GPU each launch costs host time; the codec runs eagerly there).
        """
        key = (self.alpha.data_ptr(), self.alpha._version, self.beta.data_ptr(), self.beta._version,
               self.alpha.dtype, self.alpha.device)
        if self._coefficients is None or self._coefficients[0] != key:
            with torch.no_grad():
                self._coefficients = key, (self.alpha.exp(), 1.0 / (self.beta.exp() + 1e-9))
        return self._coefficients[1]

    def forward(self, x):  # (B, C, T)
        alpha, inv_beta = self.coefficients()
        if self.kernel is not None and x.dtype == alpha.dtype:
            return self.kernel(x, alpha, inv_beta)
        # x + inv_beta * sin(x * alpha) ** 2, in one buffer: the decoder's largest activations pass
        # through here, and fresh buffers for each step cost more than the arithmetic. Bitwise the same
        # (pow(2) is t * t; the products and the sum commute exactly).
        t = torch.sin(x * alpha[None, :, None])
        return t.mul_(t).mul_(inv_beta[None, :, None]).add_(x)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)
        # The same unit over channels-last activations, where a device layer provides one
        # (device/cpu_convs.channels_last_units): `channels_last(x, state) -> (y, state)` for x (B, T, C)
        # and the causal state (B, span - 1, C), the last inputs of conv1; `enter` / `leave` change layouts.
        self.channels_last = None

    def forward(self, x):
        cl = self.channels_last
        if cl is not None:
            y, _ = cl(cl.enter(x), x.new_zeros(x.shape[0], self.conv1.span - 1, x.shape[1]))
            return cl.leave(y)
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class UpsampleBlock(nn.Module):
    """SnakeBeta, transposed conv by `rate`, then residual units with dilations 1, 3, 9."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate)]
            + [ResidualUnit(cout, d) for d in (1, 3, 9)]
        )

    def forward(self, x):
        for layer in self.block:
            x = layer(x)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x):
        return self.scale * x


class CodecTransformerLayer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.self_attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                   cfg.head_dim, cfg.rms_norm_eps, qk_norm=False, bias=cfg.attention_bias)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask=mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class CodecTransformer(nn.Module):
    """Causal transformer over frames, each position seeing the last `sliding_window` frames."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList(CodecTransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)

    def forward(self, x):  # (B, T, latent)
        t = x.shape[1]
        x = self.input_proj(x)
        positions = torch.arange(t, device=x.device)
        cos, sin = rope_cos_sin(positions[None], self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        q, k = positions[:, None], positions[None, :]
        mask = ((k <= q) & (k > q - self.cfg.sliding_window))[None, None]
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.output_proj(self.norm(x))


class Codebook(nn.Module):
    """EMA codebook stored as usage counts and embedding sums; entry = sum / usage."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def forward(self, codes):  # (B, T) -> (B, dim, T)
        table = self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]
        return F.embedding(codes, table).transpose(1, 2)


class VQLayer(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class RVQ(nn.Module):
    def __init__(self, num: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(VQLayer(size, dim) for _ in range(num))


class ResidualQuantizer(nn.Module):
    """A group of residual codebooks with 1x1 projections in and out (only `output_proj` decodes)."""

    def __init__(self, num: int, size: int, dim: int, outer_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(outer_dim, dim, 1, bias=False)  # encoder side; kept for strict loading
        self.output_proj = nn.Conv1d(dim, outer_dim, 1, bias=False)
        self.vq = RVQ(num, size, dim)

    def decode(self, codes):  # (B, num, T) -> (B, outer_dim, T)
        total = torch.zeros((), device=codes.device)
        for i, layer in enumerate(self.vq.layers):
            total = total + layer._codebook(codes[:, i])
        return self.output_proj(total)


class SplitQuantizer(nn.Module):
    """Codebook 0 (semantic) and codebooks 1..15 (acoustic) decoded separately, then summed."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = ResidualQuantizer(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualQuantizer(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)

    def decode(self, codes):  # (B, 16, T)
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class CodecDecoder(nn.Module):
    """Codes (B, 16, T) -> waveform (B, 1, T * 1920) in [-1, 1]."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.quantizer = SplitQuantizer(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = CodecTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [CausalConv(cfg.latent_dim, cfg.decoder_dim, 7)]
            + [UpsampleBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
            + [SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, 7)]
        )

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        x = self.pre_conv(self.quantizer.decode(codes))
        x = self.pre_transformer(x.transpose(1, 2)).transpose(1, 2)
        for transposed, convnext in self.upsample:
            x = convnext(transposed(x))
        for layer in self.decoder:
            x = layer(x)
        return x.clamp(-1, 1)

    def chunked(self, codes: torch.Tensor, chunk: int = 300, left_context: int = 25) -> torch.Tensor:
        """Decode long code sequences in windows of `chunk` frames, each re-reading `left_context` frames.

        This is the reference's whole-utterance decode, reproduced exactly (it is what parity compares).
        """
        per_frame = self.cfg.samples_per_frame
        pieces, start, total = [], 0, codes.shape[-1]
        while start < total:
            end = min(start + chunk, total)
            context = left_context if start > left_context else start
            wav = self(codes[..., start - context : end])
            pieces.append(wav[..., context * per_frame :])
            start = end
        return torch.cat(pieces, dim=-1)
