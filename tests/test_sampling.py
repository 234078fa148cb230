"""Sampling primitives against straightforward re-statements of the transformers semantics, and the
counter-based noise against a pure-Python statement of the hash and simple statistical checks."""

from __future__ import annotations

import math

import pytest
import torch

from omnitts import sampling
from omnitts.sampling import Plan

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

M32 = 0xFFFFFFFF


def col(*values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)[:, None]


def rows_of(n, top_k=0, top_p=1.0, temperature=1.0, do_sample=True):
    return dict(do_sample=torch.full((n,), do_sample), temperature=torch.full((n, 1), float(temperature)),
                top_k=torch.full((n, 1), top_k, dtype=torch.long), top_p=torch.full((n, 1), float(top_p)))


def keys_of(seeds, frame=0):
    seeds = torch.as_tensor(seeds, dtype=torch.long).reshape(-1, 1)
    return sampling.frame_keys(seeds, torch.full((seeds.shape[0],), frame, dtype=torch.long))


def transformers_warp(logits, temperature, top_k, top_p):
    """The previous implementation: transformers' TemperatureLogitsWarper -> TopK -> TopP, full sorts."""
    vocab = logits.shape[-1]
    logits = logits / temperature
    ordered, _ = torch.sort(logits, dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    logits = logits.masked_fill(logits < ordered.gather(-1, k - 1), float("-inf"))
    ascending, order = torch.sort(logits, dim=-1)
    remove = ascending.softmax(-1).cumsum(-1) <= (1 - top_p)
    remove[..., -1:] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


# -- logits processing -----------------------------------------------------------------------------
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


# -- warping ---------------------------------------------------------------------------------------
def test_top_k_keeps_k_best_per_row_and_ties_at_the_kth():
    values = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0], [5.0, 4.0, 3.0, 2.0, 1.0], [5.0, 4.0, 4.0, 2.0, 1.0]])
    keep = sampling.warp(values, col(2, 0, 2, dtype=torch.long), None)
    assert keep.tolist() == [[True, True, False, False, False], [True] * 5, [True, True, True, False, False]]


def test_top_p_keeps_smallest_set_reaching_p():
    values = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()  # sorted descending
    keep = sampling.warp(values, col(0, dtype=torch.long), col(0.75))
    # transformers: ascending cumulative 0.05, 0.20, 0.50, 1.0 -> remove where <= 0.25
    assert keep.tolist() == [[True, True, False, False]]
    keep = sampling.warp(values, col(0, dtype=torch.long), col(0.1))
    assert keep.tolist() == [[True, False, False, False]]  # at least the best code


@pytest.mark.parametrize("candidates", [16, 32, 64, 100])
def test_warp_over_top_candidates_equals_transformers_over_the_vocabulary(candidates):
    """Random rows and parameters: the survivors among the K best are exactly transformers' survivors."""
    gen = torch.Generator().manual_seed(candidates)
    n, vocab = 400, 100
    logits = 2 * torch.randn(n, vocab, generator=gen)
    top_k = torch.randint(1, candidates // 2 + 1, (n, 1), generator=gen)
    if candidates == vocab:  # the full-vocabulary plan also serves top-k off
        top_k[::3] = 0
    top_p = torch.rand(n, 1, generator=gen) * 0.9 + 0.1
    top_p[::4] = 1.0
    temperature = torch.rand(n, 1, generator=gen) + 0.5
    expected = torch.isfinite(transformers_warp(logits, temperature, top_k, top_p))
    values, index = torch.topk(logits, candidates)
    keep = sampling.warp(values / temperature, top_k, top_p)
    got = torch.zeros(n, vocab, dtype=torch.bool).scatter(-1, index, keep)
    assert torch.equal(got, expected)


def test_plan_picks_candidates_from_the_largest_top_k_and_skips_greedy_batches():
    assert Plan.of([(False, 50, 1.0), (False, 0, 0.5)], 3072) == Plan()  # all greedy: no warping at all
    assert not Plan().samples
    assert Plan.of([(True, 50, 1.0), (False, 0, 0.5)], 3072) == Plan(128, False)  # greedy rows do not count
    assert Plan.of([(True, 5, 0.9)], 3072) == Plan(16, True)
    assert Plan.of([(True, 64, 1.0), (True, 65, 1.0)], 3072) == Plan(256, False)  # >= 2 x the largest top_k
    assert Plan.of([(True, 50, 1.0), (True, 0, 1.0)], 3072) == Plan(3072, False)  # top-k off: whole vocabulary
    assert Plan.of([(True, sampling.MAX_TOP_K + 1, 1.0)], 2048) == Plan(2048, False)
    assert Plan.of([(True, 50, 1.0)], 64) == Plan(64, False)  # never more than the vocabulary


# -- choosing --------------------------------------------------------------------------------------
def test_greedy_rows_ignore_noise_and_sampled_rows_follow_gumbel_max():
    torch.manual_seed(0)
    logits = torch.randn(2, 50)
    rows = rows_of(2, temperature=0.7)
    rows["do_sample"] = torch.tensor([False, True])
    keys = keys_of([11, 12])
    picked = sampling.choose(logits, keys=keys, group=3, plan=Plan(50), **rows)
    assert picked[0] == logits[0].argmax()
    noise = sampling.gumbel(keys[1:], 3, torch.arange(50)[None])
    assert picked[1] == (logits[1] / 0.7 + noise[0]).argmax()
    assert torch.equal(sampling.choose(logits, keys=None, group=3, plan=Plan(), **rows), logits.argmax(-1))


def test_the_choice_does_not_depend_on_candidates_batch_mates_or_row():
    gen = torch.Generator().manual_seed(1)
    n, vocab = 64, 2048
    logits = 3 * torch.randn(n, vocab, generator=gen)
    rows = rows_of(n, top_k=20, top_p=0.8, temperature=0.9)
    keys = keys_of(torch.arange(n) * 7919, frame=5)
    picks = [sampling.choose(logits, keys=keys, group=2, plan=Plan(k, True), **rows) for k in (64, 256, vocab)]
    assert torch.equal(picks[0], picks[1]) and torch.equal(picks[0], picks[2])
    order = torch.randperm(n, generator=gen)
    shuffled = sampling.choose(logits[order], keys=keys[order], group=2, plan=Plan(64, True),
                               **{name: t[order] for name, t in rows.items()})
    assert torch.equal(shuffled, picks[0][order])
    alone = sampling.choose(logits[3:4], keys=keys[3:4], group=2, plan=Plan(64, True),
                            **{name: t[3:4] for name, t in rows.items()})
    assert alone[0] == picks[0][3]
    other_group = sampling.choose(logits, keys=keys, group=3, plan=Plan(64, True), **rows)
    assert not torch.equal(other_group, picks[0])  # each codebook draws its own noise


def chi_square(counts: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


# The 99.9th percentile of chi-square with d degrees of freedom (Wilson-Hilferty), as a bound that a
# correct sampler fails once in a thousand runs; the tests are deterministic, so they never flake.
def chi2_bound(d: int) -> float:
    return d * (1 - 2 / (9 * d) + 3.09 * math.sqrt(2 / (9 * d))) ** 3


@pytest.mark.parametrize("top_k, top_p, temperature, candidates", [
    (0, 1.0, 1.0, 64),  # plain sampling, whole vocabulary
    (6, 1.0, 0.8, 16),  # top-k over 16 candidates
    (0, 0.7, 1.0, 64),  # top-p alone
    (10, 0.85, 1.2, 32),  # both
])
def test_sampled_frequencies_match_the_warped_distribution(top_k, top_p, temperature, candidates):
    """Many requests (distinct seeds) sample one codebook: frequencies follow transformers' distribution."""
    vocab, n = 64, 40000
    logits = torch.linspace(2.0, -2.0, vocab)[torch.randperm(vocab, generator=torch.Generator().manual_seed(2))]
    target = transformers_warp(logits[None], col(temperature), col(top_k, dtype=torch.long), col(top_p)).softmax(-1)[0]
    picks = sampling.choose(logits.expand(n, vocab), keys=keys_of(torch.arange(n), frame=3), group=1,
                            plan=Plan(candidates, top_p < 1), **rows_of(n, top_k, top_p, temperature))
    counts = torch.bincount(picks, minlength=vocab).double()
    support = target > 0
    assert counts[~support].sum() == 0  # nothing outside top-k / top-p
    assert chi_square(counts[support], n * target[support].double()) < chi2_bound(int(support.sum()) - 1)


def test_sampling_across_frames_of_one_request_matches_the_distribution():
    """One seed, successive frames (the engine's counter): the same distribution, frame after frame."""
    probs = torch.tensor([0.6, 0.3, 0.1])
    n = 20000
    frames = torch.arange(n)
    keys = sampling.frame_keys(torch.full((n, 1), 1234, dtype=torch.long), frames)
    picks = sampling.choose(probs.log().expand(n, 3), keys=keys, group=0, plan=Plan(3), **rows_of(n))
    counts = torch.bincount(picks, minlength=3).double()
    assert chi_square(counts, n * probs.double()) < chi2_bound(2)


# -- the noise -------------------------------------------------------------------------------------
def py_fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def py_uniform(seed: int, frame: int, group: int, index: int) -> float:
    """The noise, restated with Python's unbounded integers: the torch version must give these bits."""
    word = seed % 2**64
    key = py_fmix32((word & M32) ^ 0x3C6EF372)
    key = py_fmix32(key ^ (word >> 32) ^ 0x243F6A88)
    key = py_fmix32(key ^ (frame & M32) ^ 0x85A308D3)
    h = py_fmix32(key ^ (((index + (group << 16)) * 0x9E3779B9) & M32))
    return ((h >> 9) + 0.5) / 2**23


def test_noise_equals_the_hash_on_unbounded_integers():
    """No int64 overflow or sign trouble: extreme seeds and counters give the exact reference bits."""
    seeds = [0, 1, 7, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62 + 12345, 2**63 - 1, -1, -(2**63), 2**64 + 5]
    frames = [0, 1, 8190, 2**31 - 1]
    words = torch.tensor([sampling.seed_word(s) for s in seeds], dtype=torch.long)[:, None]
    index = torch.tensor([[0, 1, 2047, 3071, 65535]])
    for frame in frames:
        keys = sampling.frame_keys(words, torch.full((len(seeds),), frame, dtype=torch.long))
        for group in (0, 1, 15):
            u = sampling.uniforms(keys, group, index)
            expected = [[py_uniform(s, frame, group, int(i)) for i in index[0]] for s in seeds]
            assert u.dtype == torch.float32 and u.tolist() == expected, (frame, group)


def test_seed_word_is_the_low_64_bits_as_int64():
    assert sampling.seed_word(None) == 0 and sampling.seed_word(5) == 5
    assert sampling.seed_word(2**64 + 5) == 5 and sampling.seed_word(2**63) == -(2**63)
    assert sampling.seed_word(2**64 - 1) == -1


def uniform_grid(seeds=256, frames=4, groups=4, vocab=256) -> torch.Tensor:
    """Uniforms (seeds, frames, groups, vocab) over consecutive seeds, frames, groups and indices."""
    frame = torch.arange(frames).repeat(seeds)
    keys = sampling.frame_keys(torch.arange(seeds).repeat_interleave(frames)[:, None], frame)
    index = torch.arange(vocab)[None]
    return torch.stack([sampling.uniforms(keys, g, index) for g in range(groups)], 1).reshape(seeds, frames, groups, vocab)


def test_uniforms_are_uniform_and_never_0_or_1():
    u = uniform_grid().flatten().double()
    n = u.numel()  # 2**20
    assert 0 < u.min() and u.max() < 1
    counts = torch.histc(u, bins=1024, min=0, max=1)
    assert chi_square(counts, torch.full_like(counts, n / 1024)) < chi2_bound(1023)
    ks = (torch.arange(1, n + 1, dtype=torch.float64) / n - u.sort().values).abs().max()
    assert ks < 1.95 / math.sqrt(n)  # Kolmogorov-Smirnov at 0.1 %
    bits = (u * 2**23).long()
    for bit in range(23):  # every output bit is balanced
        ones = ((bits >> bit) & 1).double().mean()
        assert abs(ones - 0.5) < 3.3 * 0.5 / math.sqrt(n), bit


def test_neighbouring_counters_and_seeds_are_uncorrelated():
    """Mean products of centred uniforms one step apart along every counter are ~0 (sd 1/(12 sqrt n))."""
    c = uniform_grid().double() - 0.5
    for axis in range(4):  # seed, frame, group, vocabulary index
        a, b = c.narrow(axis, 0, c.shape[axis] - 1), c.narrow(axis, 1, c.shape[axis] - 1)
        corr = (a * b).mean() * 12  # a correlation coefficient: var(u) = 1/12
        assert abs(corr) < 4 / math.sqrt(a.numel()), (axis, float(corr))
    # frame keys of consecutive seeds and frames spread over all 32 bits
    keys = keys_of(torch.arange(4096))
    assert keys.unique().numel() == 4096 and keys.min() >= 0 and keys.max() < 2**32
    assert abs(float(((keys >> 31) & 1).double().mean()) - 0.5) < 0.05


def test_gumbel_noise_has_the_gumbel_mean_and_variance():
    g = sampling.gumbel(keys_of(torch.arange(512)), 0, torch.arange(2048)[None]).double().flatten()
    assert abs(float(g.mean()) - 0.5772) < 0.01  # Euler-Mascheroni
    assert abs(float(g.var()) - math.pi**2 / 6) < 0.02


def test_a_sampled_frame_passes_no_python_number_as_a_tensor_operand():
    """Sampled frames run inside device graphs: a Python number operand (x >> 16, x < 0, torch.where(c, x, 5))
    is a host-to-device copy on some backends (torch_npu before 2.11 stages it through pinned memory, which
    capture does not support). Every constant is a device tensor; fill values go to ops that take them as
    attributes (masked_fill, clamp). Checked at the dispatcher, over everything one sampled frame runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    operand_ops = {"add", "sub", "mul", "div", "__rshift__", "__lshift__", "bitwise_and", "bitwise_or",
                   "bitwise_xor", "gt", "lt", "ge", "le", "eq", "ne", "where", "maximum", "minimum", "remainder"}
    seen = []

    class NoPythonOperands(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            numbers = [a for a in args if isinstance(a, (bool, int, float))]
            if name == "scalar_tensor" or (name in operand_ops and numbers):
                seen.append(f"{func}{tuple(numbers)}")
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    logits = torch.randn(3, 3072)
    rows = rows_of(3, top_k=50, top_p=0.8, temperature=0.9)
    seen_codes = torch.zeros(3, 3072, dtype=torch.bool)
    sampling.choose(logits, keys=keys_of([1, 2, 3]), group=0, plan=Plan(128, True), **rows)  # constants made
    with NoPythonOperands():
        keys = sampling.frame_keys(torch.tensor([[1], [2], [3]]), torch.tensor([4, 5, 6]))
        processed = sampling.process_talker(logits, seen_codes, torch.full((3, 1), 1.05), torch.tensor([0, 1, 5]),
                                            sampling.talker_mask(3072, 2150), eos=2150)
        for group, plan in ((0, Plan(128, True)), (1, Plan(3072, False)), (5, Plan(64, True))):
            sampling.choose(processed, keys=keys, group=group, plan=plan, **rows)
    assert seen == []
    with NoPythonOperands():  # the check itself sees what it must refuse
        torch.where(logits > 0, logits, 5.0) + 1
    assert len(seen) == 3
