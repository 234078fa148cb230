"""Sampling primitives against straightforward re-statements of the transformers semantics."""

from __future__ import annotations

import torch

from omnitts import sampling


def test_repetition_penalty_divides_positive_multiplies_negative_once():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    history = torch.tensor([[0, 1, 0, 0]])  # repeats count once
    out = sampling.repetition_penalty(logits, history, 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]]


def test_top_k_keeps_k_best():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    out = sampling.warp(logits, 1.0, 2, 1.0)
    assert torch.isfinite(out).tolist() == [[False, True, False, True, False]]


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = sampling.warp(probs.log(), 1.0, 0, 0.75)
    # sorted ascending cumulative: 0.05, 0.20, 0.50, 1.0 -> remove where <= 0.25
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]


def test_talker_mask_suppresses_control_codes_but_eos():
    mask = sampling.talker_mask(3072, 2150)
    assert mask[2048:].sum() == 1023 and not mask[2150] and not mask[:2048].any()


def test_greedy_pick_is_argmax_and_sampling_respects_generator():
    logits = torch.randn(4, 50)
    assert torch.equal(sampling.pick(logits, False, 0.9, 50, 1.0), logits.argmax(-1))
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert torch.equal(sampling.pick(logits, True, 0.9, 10, 0.9, g1), sampling.pick(logits, True, 0.9, 10, 0.9, g2))
