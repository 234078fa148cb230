"""The talker LM and its code predictor (the "sub-talker").

The talker reads a sequence of embeddings (text projected into its space, plus codec embeddings) and
predicts codebook 0 of each 80 ms frame. The code predictor, given the talker's last hidden state and
codebook 0, predicts codebooks 1..15 of the same frame, one at a time. Parameter names follow the
checkpoint (`talker.model.layers.0...`, `talker.code_predictor.lm_head.3...`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DecoderConfig, TalkerConfig
from .layers import DecoderStack


class TextProjection(nn.Module):
    """Two-layer MLP (with bias) from the text embedding space to the talker hidden size."""

    def __init__(self, text_hidden: int, hidden: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x):
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerModel(DecoderStack):
    """Decoder stack plus the talker's two input tables (codec ids and text ids)."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__(cfg)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class PredictorModel(DecoderStack):
    """Decoder stack plus one input table per residual codebook (1..G-1), in talker hidden size."""

    def __init__(self, cfg: DecoderConfig, embedding_dim: int):
        super().__init__(cfg)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, embedding_dim) for _ in range(cfg.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    """Predicts codebooks 1..G-1 of a frame from [talker hidden, embed(c0), embed(c1), ...]."""

    def __init__(self, cfg: DecoderConfig, talker_hidden: int):
        super().__init__()
        self.cfg = cfg
        self.model = PredictorModel(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_code_groups - 1)
        )
        if cfg.hidden_size != talker_hidden:
            self.small_to_mtp_projection = nn.Linear(talker_hidden, cfg.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()

    def embed(self, group: int, codes: torch.Tensor) -> torch.Tensor:
        """Embedding of codebook `group` (1..G-1) codes, in talker hidden size."""
        return self.model.codec_embedding[group - 1](codes)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None, cache=None, mask=None,
                attend=None, rope=None) -> torch.Tensor:
        """x (B, T, talker_hidden) -> last-layer hidden (B, T, predictor_hidden). `rope`: see `DecoderStack`."""
        return self.model(self.small_to_mtp_projection(x), positions, cache, mask, attend, rope)

    def logits(self, group: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of codebook `group` (1..G-1) from predictor hidden states."""
        return self.lm_head[group - 1](hidden)


class Talker(nn.Module):
    """Talker decoder, text projection, codebook-0 head and the code predictor."""

    def __init__(self, cfg: TalkerConfig, predictor_cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.model = TalkerModel(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = CodePredictor(predictor_cfg, cfg.hidden_size)
        # Sampling kernels with the contracts of `sampling.frame_keys`, `sampling.gumbel_scores` and
        # `sampling.draw` (passed to `sampling.choose` as its `scores` and `pick`), where a device layer
        # provides fused ones (device/fused.py); None: those.
        self.frame_keys = None
        self.gumbel_scores = None
        self.pick = None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the talker computes in (its embeddings'; a packed CPU linear may store its weight
        narrower, see device/cpu_weights.PackedLinear)."""
        return self.model.codec_embedding.weight.dtype

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """Text token ids (..., T) -> talker-space embeddings (..., T, hidden).

        The table may be kept narrower than the model (the loader leaves it in its stored dtype);
        the gathered rows are widened to the dtype of the other embeddings, which is exact."""
        rows = self.model.text_embedding(ids).to(self.model.codec_embedding.weight.dtype)
        return self.text_projection(rows)

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        """Codebook-0 / control codec ids -> embeddings."""
        return self.model.codec_embedding(ids)

    def embed_frame(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the G code embeddings of frames `codes` (..., G) -> (..., hidden)."""
        parts = [self.embed_codec(codes[..., 0])]
        parts += [self.code_predictor.embed(g, codes[..., g]) for g in range(1, codes.shape[-1])]
        # One reduction over the stacked parts, in the reference's order (bitwise-equal sums).
        return torch.stack(parts, dim=-2).sum(-2)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None, cache=None, mask=None,
                rope=None) -> torch.Tensor:
        """x (B, T, hidden) -> final hidden states (B, T, hidden). `rope`: see `DecoderStack`."""
        return self.model(x, positions, cache, mask, rope=rope)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codec_head(hidden)
