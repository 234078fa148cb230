"""The slow path: one request at a time, eager, written to be obviously correct.

This is the yardstick every fast path is tested against (batched engine, graphs, streaming decode),
and it is itself tested for parity with the official package. It mirrors the official loop:

    prefill -> logits -> c0 -> [code predictor: c1..c15 -> frame -> next input] -> logits -> c0 ...

stopping when c0 is EOS (never part of the output) or the frame budget is reached. Logits are taken
from the same tensor shapes as the official code (heads applied to every prefill position, then the
last row kept) so greedy results match bit for bit on the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from .. import sampling
from ..models.kv_cache import FrameKVCache, KVCache, StaticKVCache
from ..params import RowParams, SamplingParams, fresh_seed
from ..text.prompt import Prompt


@dataclass
class Generation:
    codes: torch.Tensor  # (frames, 16) int64, CPU
    finish_reason: str  # "eos" | "length"
    talker_margin: float  # smallest top-1/top-2 gap of the processed codebook-0 logits (greedy robustness)
    predictor_margin: float  # same for codebooks 1..15


@torch.inference_mode()
def generate_codes(ckpt, prompt: Prompt, params: SamplingParams) -> Generation:
    """Run the talker and code predictor for one prompt until EOS or `params.max_frames` frames."""
    params = params.with_budget(prompt.text_tokens)
    talker = ckpt.model.talker
    tcfg, pcfg = ckpt.config.talker, ckpt.config.predictor
    dev = ckpt.device
    if params.samples and params.seed is None:
        params = replace(params, seed=fresh_seed())
    rows = RowParams.of([params], dev)
    plan = sampling.FramePlan.of([params], tcfg.vocab_size, pcfg.vocab_size)
    suppress = sampling.talker_mask(tcfg.vocab_size, tcfg.codec_eos_token_id).to(dev)
    eos = tcfg.codec_eos_token_id

    cache = KVCache(tcfg.num_hidden_layers)
    x = prompt.embeds.unsqueeze(0).to(talker.dtype)
    length = x.shape[1]
    hidden = talker(x, torch.arange(length, device=dev)[None], cache)
    logits = talker.logits(hidden)[:, -1].float()  # (1, V)
    seen = torch.zeros_like(logits, dtype=torch.bool)
    frames: list[torch.Tensor] = []
    margins_t, margins_p = [], []
    finish = "length"
    while True:
        generated = torch.tensor([len(frames)], device=dev)
        keys = (talker.frame_keys or sampling.frame_keys)(rows.seed, generated) if plan.samples else None
        logits = sampling.process_talker(logits, seen, rows.penalty, generated, suppress, eos)
        margins_t.append(sampling.margin(logits))
        c0 = sampling.choose(logits, rows.do_sample, rows.temperature, rows.top_k, rows.top_p, keys, 0,
                             plan.talker, talker.gumbel_scores, talker.pick)
        if int(c0) == eos:
            finish = "eos"
            break
        seen[0, c0] = True
        codes = predict_residuals(talker, hidden[:, -1], c0, rows, keys, plan.predictor, margins_p)
        frames.append(codes)
        if len(frames) >= params.max_frames:
            break
        step = len(frames) - 1  # this frame's input also carries trailing text token `step`
        text = prompt.trailing[step] if step < prompt.trailing.shape[0] else prompt.pad
        x = (talker.embed_frame(codes) + text).unsqueeze(1)  # (1, 1, D)
        hidden = talker(x, torch.tensor([[length + step]], device=dev), cache)
        logits = talker.logits(hidden)[:, -1].float()
    codes = torch.cat(frames, dim=0).cpu() if frames else torch.zeros((0, tcfg.num_code_groups), dtype=torch.long)
    return Generation(codes, finish, min(margins_t), min(margins_p, default=float("inf")))


def predict_residuals(talker, past_hidden, c0, rows: RowParams, keys, plan: sampling.Plan,
                      margins: list | None = None, frame_cache: FrameKVCache | StaticKVCache | None = None
                      ) -> torch.Tensor:
    """Codebooks 1..G-1 of one frame for every row, each step conditioned on the frame's earlier codes.

    past_hidden (B, D) is the talker's last hidden state, c0 (B,) codebook 0, `rows` the rows'
    sub-talker parameters, `keys` the frame's noise keys (`sampling.frame_keys`; None when `plan`, the
    host-known sub-talker plan, samples nothing). The engine's frame calls this same function, so the
    fast and slow paths cannot drift apart. `margins` (slow path only) collects greedy margins, which
    costs a host sync per step. `frame_cache` replaces the growing frame-local K/V cache with a
    preallocated one, reused frame after frame: a `FrameKVCache` (`predictor_frame_cache`: same results, no
    allocation per step; the CPU and CUDA engines) or a fixed-shape `StaticKVCache` with its kernel
    (`predictor_cache`: every step attends over all G positions under a mask, so graph replays need no
    per-step parameters; the NPU path).
    """
    predictor = talker.code_predictor
    groups = predictor.cfg.num_code_groups
    batch, dev = c0.shape[0], c0.device
    cache = KVCache(predictor.cfg.num_hidden_layers) if frame_cache is None else frame_cache.start(batch)

    x = torch.stack([past_hidden, talker.embed_codec(c0)], dim=1)  # (B, 2, D)
    table = predictor.model.rope_table(groups, x.dtype, dev)  # positions 0..G-1, made once

    def forward(x, start):  # causal prefill, then one position per step (masks: the static cache's)
        rope = table.span(start, start + x.shape[1], batch)
        return predictor(x, None, cache, cache.mask(x.shape[1]), cache.attend, rope)

    hidden = forward(x, 0)
    codes = [c0]
    for group in range(1, groups):
        logits = predictor.logits(group, hidden)[:, -1].float()  # heads on every position, as officially
        if margins is not None:
            margins.append(sampling.margin(logits))
        code = sampling.choose(logits, rows.sub_do_sample, rows.sub_temperature, rows.sub_top_k, rows.sub_top_p,
                               keys, group, plan, talker.gumbel_scores, talker.pick)
        codes.append(code)
        if group < groups - 1:
            hidden = forward(predictor.embed(group, code)[:, None], group + 1)
    return torch.stack(codes, dim=-1)


def predictor_frame_cache(talker, rows: int) -> FrameKVCache:
    """A preallocated frame-local K/V cache for the code predictor: rows x G positions per layer, in
    the predictor's K/V dtype (`DecoderStack.kv_dtype`: float32 where its attention widens)."""
    cfg = talker.code_predictor.cfg
    weight = talker.code_predictor.lm_head[0].weight
    dtype = talker.code_predictor.model.kv_dtype or talker.dtype
    return FrameKVCache(cfg.num_hidden_layers, rows, cfg.num_key_value_heads, cfg.num_code_groups, cfg.head_dim,
                        dtype, weight.device)


def predictor_cache(talker, rows: int, attend=None) -> StaticKVCache:
    """A fixed-shape frame-local K/V cache for the code predictor: rows x G positions per layer.

    A frame fills positions 0..G-1 ([talker hidden, c0] then c1..c14; c15 is never fed back).
    `attend` is the kernel run over it (default: torch's sdpa with the mask).
    """
    cfg = talker.code_predictor.cfg
    weight = talker.code_predictor.lm_head[0].weight
    kwargs = {} if attend is None else {"attend": attend}
    return StaticKVCache(cfg.num_hidden_layers, rows, cfg.num_key_value_heads, cfg.num_code_groups, cfg.head_dim,
                         talker.dtype, weight.device, **kwargs)


@torch.inference_mode()
def decode_codes(ckpt, codes: torch.Tensor, ref_codes: torch.Tensor | None = None) -> np.ndarray:
    """Frames (F, 16) -> float32 waveform at 24 kHz, the reference's whole-utterance decode.

    With `ref_codes` (ICL cloning) the reference frames are decoded in front, as the official
    pipeline does, and the matching share of samples is cut from the start.
    """
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.float32)
    full = codes if ref_codes is None else torch.cat([ref_codes.to(codes.device), codes], dim=0)
    wav = ckpt.codec.chunked(full.T.unsqueeze(0).to(ckpt.device))[0, 0].float().cpu().numpy()
    if ref_codes is not None:
        cut = int(ref_codes.shape[0] / max(full.shape[0], 1) * wav.shape[0])
        wav = wav[cut:]
    return wav
