"""Logits processing and sampling with the official (transformers `generate`) semantics.

Order, as transformers applies it: repetition penalty -> EOS ban before `min_new_tokens` -> suppressed
codes -> temperature -> top-k -> top-p -> sample (or argmax when greedy). These functions work on a
batch of rows (B, V) with per-row parameters so the slow path and the engine share them.
"""

from __future__ import annotations

import torch

MIN_NEW_TOKENS = 2  # the official talker never stops before its third codebook-0 token


def repetition_penalty(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """Penalise each code in `history` (B, N) once: divide positive logits, multiply negative ones."""
    if history.shape[-1] == 0 or penalty == 1.0:
        return logits
    picked = logits.gather(-1, history)
    picked = torch.where(picked < 0, picked * penalty, picked / penalty)
    return logits.scatter(-1, history, picked)


def talker_mask(vocab: int, eos: int, device=None) -> torch.Tensor:
    """Boolean (V,) of codes the talker may never emit: the top 1024 ids (control codes) except EOS."""
    mask = torch.zeros(vocab, dtype=torch.bool, device=device)
    mask[vocab - 1024:] = True
    mask[eos] = False
    return mask


def warp(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, top-k and top-p filtering (filtered entries become -inf)."""
    if temperature != 1.0:
        logits = logits / temperature
    if top_k:
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = False  # keep at least the most likely code
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return logits


def pick(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int, top_p: float,
         generator: torch.Generator | None = None) -> torch.Tensor:
    """Choose one code per row of `logits` (B, V) -> (B,)."""
    if not do_sample:
        return logits.argmax(-1)
    probs = warp(logits, temperature, top_k, top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def margin(logits: torch.Tensor) -> float:
    """Gap between the best and second-best logit of each row, minimum over rows (greedy robustness)."""
    top2 = torch.topk(logits.float(), 2).values
    return float((top2[..., 0] - top2[..., 1]).min())
