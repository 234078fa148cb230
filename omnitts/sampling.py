"""Logits processing and sampling with the official (transformers `generate`) semantics, batched.

Order, as transformers applies it: repetition penalty -> EOS ban before `min_new_tokens` -> suppressed
codes -> temperature -> top-k -> top-p -> sample (or argmax when greedy). Every function takes a batch
of rows (B, V) with per-row parameters as tensors, makes no host sync, and so serves both the slow
path (B = 1) and the engine's captured frame step.

Randomness comes in as noise instead of from a global generator: a row's choice is
argmax(probs / E) with E ~ Exp(1) drawn from that request's own seeded generator (the "exponential
race", exactly distributed as sampling from `probs`). So a request's codes do not depend on which
other requests share its batch, and the slow path and the engine draw the same noise stream.
"""

from __future__ import annotations

import torch

MIN_NEW_TOKENS = 2  # the official talker never stops before its third codebook-0 token


def frame_noise_size(talker_vocab: int, predictor_vocab: int, groups: int) -> int:
    """Exponential draws one frame consumes: one row for codebook 0, one per residual codebook."""
    return talker_vocab + (groups - 1) * predictor_vocab


def draw_noise(generator: torch.Generator, size: int, device=None) -> torch.Tensor:
    """One frame's noise for one request. Always this one call, so every path draws the same stream."""
    return torch.empty(size, device=device).exponential_(generator=generator)


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Penalise every code in `seen` (B, V bool) once: divide positive logits, multiply negative ones."""
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def talker_mask(vocab: int, eos: int, device=None) -> torch.Tensor:
    """Boolean (V,) of codes the talker may never emit: the top 1024 ids (control codes) except EOS."""
    mask = torch.zeros(vocab, dtype=torch.bool, device=device)
    mask[vocab - 1024:] = True
    mask[eos] = False
    return mask


def process_talker(logits, seen, penalty, generated, suppress, eos: int) -> torch.Tensor:
    """Codebook-0 logits (B, V) -> processed logits: penalty, EOS ban while `generated` < 2, suppression."""
    logits = repetition_penalty(logits, seen, penalty)
    too_early = (generated < MIN_NEW_TOKENS)[:, None] & (torch.arange(logits.shape[-1], device=logits.device) == eos)
    return logits.masked_fill(too_early | suppress, float("-inf"))


def warp(logits, temperature, top_k, top_p) -> torch.Tensor:
    """Temperature, top-k (0 = off) and top-p filtering per row; filtered entries become -inf.

    temperature, top_p: (B, 1) float; top_k: (B, 1) int64.
    """
    vocab = logits.shape[-1]
    logits = logits / temperature
    ordered, _ = torch.sort(logits, dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    kth = ordered.gather(-1, k - 1)
    logits = logits.masked_fill(logits < kth, float("-inf"))
    ascending, order = torch.sort(logits, dim=-1)
    cumulative = ascending.softmax(-1).cumsum(-1)
    remove = cumulative <= (1 - top_p)
    remove[..., -1:] = False  # keep at least the most likely code
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def choose(logits, do_sample, temperature, top_k, top_p, noise) -> torch.Tensor:
    """One code per row: argmax where `do_sample` (B,) is False, else the exponential race on `noise`."""
    greedy = logits.argmax(-1)
    probs = warp(logits, temperature, top_k, top_p).softmax(-1)
    sampled = (probs / noise).argmax(-1)
    return torch.where(do_sample, sampled, greedy)


def margin(logits: torch.Tensor) -> float:
    """Gap between the best and second-best logit of each row, minimum over rows (greedy robustness)."""
    top2 = torch.topk(logits.float(), 2).values
    return float((top2[..., 0] - top2[..., 1]).min())
