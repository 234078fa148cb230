"""Sampling primitives against straightforward re-statements of the transformers semantics."""

from __future__ import annotations

import torch

from omnitts import sampling


def col(*values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)[:, None]


def test_repetition_penalty_divides_positive_multiplies_negative_once():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    seen = torch.tensor([[True, True, False, False]])
    out = sampling.repetition_penalty(logits, seen, col(2.0))
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]]


def test_eos_is_banned_before_two_codes_and_control_codes_always():
    vocab, eos = 3072, 2150
    logits = torch.zeros(2, vocab)
    suppress = sampling.talker_mask(vocab, eos)
    out = sampling.process_talker(logits, torch.zeros(2, vocab, dtype=torch.bool), col(1.0, 1.0),
                                  torch.tensor([1, 2]), suppress, eos)
    assert out[0, eos] == float("-inf") and out[1, eos] == 0
    assert torch.isinf(out[:, 2048:]).sum() == 2 * 1023 + 1
    assert suppress[2048:].sum() == 1023 and not suppress[eos] and not suppress[:2048].any()


def test_top_k_keeps_k_best_per_row():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0], [1.0, 5.0, 3.0, 4.0, 2.0]])
    out = sampling.warp(logits, col(1.0, 1.0), col(2, 0, dtype=torch.long), col(1.0, 1.0))
    assert torch.isfinite(out).tolist() == [[False, True, False, True, False], [True] * 5]


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = sampling.warp(probs.log(), col(1.0), col(0, dtype=torch.long), col(0.75))
    # sorted ascending cumulative: 0.05, 0.20, 0.50, 1.0 -> remove where <= 0.25
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]


def test_greedy_rows_ignore_noise_and_sampled_rows_follow_it():
    torch.manual_seed(0)
    logits = torch.randn(2, 50)
    rows = dict(temperature=col(1.0, 1.0), top_k=col(0, 0, dtype=torch.long), top_p=col(1.0, 1.0))
    noise = torch.empty(2, 50).exponential_()
    picked = sampling.choose(logits, torch.tensor([False, True]), noise=noise, **rows)
    assert picked[0] == logits[0].argmax()
    assert picked[1] == (logits[1].softmax(-1) / noise[1]).argmax()


def test_exponential_race_matches_the_distribution():
    """argmax(p / E) with E ~ Exp(1) samples from p: check frequencies on a small vocabulary."""
    probs = torch.tensor([0.6, 0.3, 0.1])
    gen = torch.Generator().manual_seed(0)
    n = 20000
    noise = torch.empty(n, 3).exponential_(generator=gen)
    picks = sampling.choose(probs.log().expand(n, 3), torch.ones(n, dtype=torch.bool),
                            torch.ones(n, 1), torch.zeros(n, 1, dtype=torch.long), torch.ones(n, 1), noise)
    freq = torch.bincount(picks, minlength=3).float() / n
    assert torch.allclose(freq, probs, atol=0.015)
