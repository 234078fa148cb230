"""Logits processing and sampling with the official (transformers `generate`) semantics, batched.

Order, as transformers applies it: repetition penalty -> EOS ban before `min_new_tokens` -> suppressed
codes -> temperature -> top-k -> top-p -> sample (or argmax when greedy). Every function takes a batch
of rows (B, V) with per-row parameters as tensors, makes no host sync and draws no random numbers, so
it serves both the slow path (B = 1) and the engine's captured frame step.

Noise is counter-based (no generator, no buffer): the uniform for vocabulary entry `index` of codebook
`group` in frame `frame` of a request seeded `seed` is a pure integer hash of those four numbers
(`frame_keys` folds seed and frame into a 32-bit key per row once a frame; `uniforms` mixes in group
and index with murmur3's finaliser), computed in the frame with plain int64 adds, multiplies, xors,
ands and shifts on values kept below 2**32 (no overflow, no sign bits; the same bits on every
device). A sampled row picks argmax(logit / T + G) over its surviving codes, G = -log(-log(u)) the
Gumbel noise *of each code's vocabulary index* (the Gumbel-max trick, i.e. the exponential race
argmax(p / E)): exactly a draw from the warped distribution, and independent of batch mates, slot,
candidate count and device (up to last-ulp differences of `log` between devices).

Warping looks only at the K best logits per row (`torch.topk`, K static so graphs can be captured):
K is chosen on the host from the batch's known parameters (`Plan.of`): the smallest power of two
>= 2 x the largest top_k among sampled rows (the slack keeps ties at the k-th value inside the
candidates), or the whole vocabulary (one sort) when some sampled row has top-k off or above
`MAX_TOP_K`; a batch with no sampled row never warps (argmax only), and top-p runs only when some
sampled row has top_p < 1. The choice must not depend on K, so both filters are value thresholds:
  - top-k keeps every code >= the k-th largest value (ties kept, as transformers does);
  - top-p sums probabilities as integers (round(exp(v - max) * 2**24)), exact in any order and
    unchanged by appended zeros, keeps sorted position j while the mass strictly before it is < p,
    then keeps every code >= the smallest kept value (a tie group at the boundary stays whole, where
    transformers keeps an arbitrary part of it), at least the best code.
The one case where K matters: more than K - top_k codes tied at the k-th value (K >= 2 top_k).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_NEW_TOKENS = 2  # the official talker never stops before its third codebook-0 token
MAX_TOP_K = 256  # above this, a sampled row warps over the whole vocabulary (one sort)
MIN_CANDIDATES = 16

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # odd; spreads consecutive counters over the 32-bit space
_MASS_ONE = 2**24  # fixed-point unit of the top-p probability sums
_CONSTANTS: dict[tuple, torch.Tensor] = {}


def _c(value, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`value` as a 0-dim tensor on `like`'s device, made once per (value, dtype, device).

    These functions run inside captured device graphs, where a Python number operand is a host-to-device
    copy on some backends (torch_npu before 2.11 stages it through a pinned buffer, which graph capture
    does not support): every constant operand is a device tensor instead, and fill values go to ops that
    take them as attributes (`masked_fill`, `clamp`). The first call, in an eager warm-up, makes them.
    """
    dtype = dtype or like.dtype
    key = (value, dtype, like.device)
    tensor = _CONSTANTS.get(key)
    if tensor is None:
        tensor = _CONSTANTS[key] = torch.tensor(value, dtype=dtype, device=like.device)
    return tensor


# -- counter-based noise -------------------------------------------------------------------------
def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2**32 for 0 <= x < 2**32 without int64 overflow: c >= 2**31 is used as c - 2**32,
    whose product stays in (-2**63, 2**63); the mask then keeps the low 32 bits (two's complement)."""
    return (x * _c(c - 2**32 if c >= 2**31 else c, x)) & _c(_M32, x)


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser (a bijection with full avalanche) on values in [0, 2**32)."""
    h = h ^ (h >> _c(16, h))
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> _c(13, h))
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> _c(16, h))


def seed_word(seed: int | None) -> int:
    """A request seed as the int64 a row stores: its low 64 bits, two's complement (None -> 0)."""
    if seed is None:
        return 0
    return ((int(seed) % 2**64) ^ 2**63) - 2**63


def frame_keys(seed: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """Per-row 32-bit keys (B, 1) int64 for one frame, from seeds (B, 1) int64 and frame indices (B,)."""
    mask = _c(_M32, seed)
    lo, hi = seed & mask, (seed >> _c(32, seed)) & mask  # arithmetic shift, then mask: the top word as unsigned
    h = _fmix32(lo ^ _c(0x3C6EF372, seed))  # the constants keep all-zero inputs away from fmix32's fixed point 0
    h = _fmix32(h ^ hi ^ _c(0x243F6A88, seed))
    return _fmix32(h ^ (frame.reshape(-1, 1) & _c(_M32, frame)) ^ _c(0x85A308D3, seed))


def uniforms(keys: torch.Tensor, group: int, index: torch.Tensor) -> torch.Tensor:
    """Uniforms in (0, 1) float32, never 0 or 1, for codes `index` (B, N) of codebook `group`.

    u = ((h >> 9) + 0.5) / 2**23 is exact in float32, so it lies in [2**-24, 1 - 2**-24].
    """
    counter = index + _c(group << 16, index)  # index < 2**16 (vocabularies are 2048 and 3072)
    h = _fmix32(keys ^ _mul32(counter, _GOLDEN))
    u = (h >> _c(9, h)).float()
    return (u + _c(0.5, u)) * _c(2.0**-23, u)


def gumbel(keys: torch.Tensor, group: int, index: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise -log(-log(u)) for codes `index` (B, N) of codebook `group`."""
    return -torch.log(-torch.log(uniforms(keys, group, index)))


def gumbel_scores(values: torch.Tensor, keep: torch.Tensor, keys: torch.Tensor, group: int,
                  index: torch.Tensor) -> torch.Tensor:
    """The Gumbel-max race's scores: tempered `values` (B, N) plus each code's noise, -inf where `keep` is
    False (the warpers' verdict). The contract of `choose`'s `scores` kernel (device/fused.py)."""
    return (values + gumbel(keys, group, index)).masked_fill(~keep, float("-inf"))


# -- logits processing ---------------------------------------------------------------------------
def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Penalise every code in `seen` (B, V bool) once: divide positive logits, multiply negative ones."""
    penalised = torch.where(logits < _c(0.0, logits), logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def talker_mask(vocab: int, eos: int) -> torch.Tensor:
    """Boolean (V,) of codes the talker may never emit: the top 1024 ids (control codes) except EOS.

    On the host: callers upload it (`device.copies.upload`); a scalar stored into a device tensor is a
    blocking copy of the scalar.
    """
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[vocab - 1024:] = True
    mask[eos] = False
    return mask


def process_talker(logits, seen, penalty, generated, suppress, eos: int) -> torch.Tensor:
    """Codebook-0 logits (B, V) -> processed logits: penalty, EOS ban while `generated` < 2, suppression."""
    logits = repetition_penalty(logits, seen, penalty)
    codes = torch.arange(logits.shape[-1], device=logits.device)
    too_early = (generated < _c(MIN_NEW_TOKENS, generated))[:, None] & (codes == _c(eos, codes))
    return logits.masked_fill(too_early | suppress, float("-inf"))


# -- the host-known plan ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """How a batch chooses one kind of codebook; static per captured graph, derived on the host.

    `candidates`: 0 when no row samples (argmax only, no warping), else K logits per row go
    through the warpers (K == the vocabulary: all of them). `top_p`: some sampled row has top_p < 1.
    """

    candidates: int = 0
    top_p: bool = False

    @property
    def samples(self) -> bool:
        return self.candidates > 0

    @classmethod
    def of(cls, rows: list[tuple[bool, int, float]], vocab: int) -> "Plan":
        """From (do_sample, top_k, top_p) of every row in the batch."""
        sampled = [(k, p) for do, k, p in rows if do]
        if not sampled:
            return cls()
        top_k = [k for k, _ in sampled]
        top_p = any(p < 1 for _, p in sampled)
        if min(top_k) == 0 or max(top_k) > MAX_TOP_K:
            return cls(vocab, top_p)
        k = MIN_CANDIDATES
        while k < 2 * max(top_k):
            k *= 2
        return cls(min(k, vocab), top_p)


@dataclass(frozen=True)
class FramePlan:
    """Plans for codebook 0 (talker) and codebooks 1..15 (sub-talker) of one frame."""

    talker: Plan = Plan()
    predictor: Plan = Plan()

    @property
    def samples(self) -> bool:
        return self.talker.samples or self.predictor.samples

    @classmethod
    def of(cls, params: list, talker_vocab: int, predictor_vocab: int) -> "FramePlan":
        """From the SamplingParams of every request in the batch."""
        return cls(Plan.of([(p.do_sample, p.top_k, p.top_p) for p in params], talker_vocab),
                   Plan.of([(p.subtalker_dosample, p.subtalker_top_k, p.subtalker_top_p) for p in params],
                           predictor_vocab))


# -- choosing ------------------------------------------------------------------------------------
def warp(values: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor | None) -> torch.Tensor:
    """Which of the K best tempered logits per row survive top-k then top-p: bool (B, K).

    values (B, K) sorted descending; top_k (B, 1) int64 (0 = off); top_p (B, 1) float, or None when
    no row filters by top-p. Both filters are value thresholds, so the result does not depend on K.
    """
    candidates = values.shape[-1]
    k = top_k.masked_fill(top_k <= _c(0, top_k), candidates).clamp(1, candidates)  # greedy rows may ask for more
    kth = values.gather(-1, k - _c(1, k))
    if top_p is None:
        return values >= kth
    in_k = values >= kth
    mass = torch.round(torch.exp(values - values[:, :1]) * _c(float(_MASS_ONE), values)).long() * in_k  # exact
    before = mass.cumsum(-1) - mass  # mass strictly before each position, exact
    kept = (before.float() < top_p * mass.sum(-1, keepdim=True).float()) | (top_p >= _c(1.0, top_p))
    cut = values.masked_fill(~(kept & in_k), float("inf")).amin(-1, keepdim=True)  # smallest kept value
    return values >= torch.maximum(kth, cut)


def choose(logits, do_sample, temperature, top_k, top_p, keys, group: int, plan: Plan, scores=None,
           pick=None) -> torch.Tensor:
    """One code per row (B,): argmax where `do_sample` (B,) is False, else a Gumbel-max draw.

    temperature, top_p: (B, 1) float; top_k: (B, 1) int64; keys (B, 1) from `frame_keys` (None when
    the plan does not sample); `group` the codebook (0 talker, 1..15 sub-talker). `scores`: a kernel
    computing `gumbel_scores` (device/fused.py's: one launch instead of ~25; None: `gumbel_scores`);
    `pick`: one computing `draw`, the whole draw from the candidates where no row filters by top-p
    (device/fused.py's: one launch instead of ~10; None: `draw` with `scores`).
    """
    greedy = logits.argmax(-1)
    if not plan.samples:
        return greedy
    if plan.candidates < logits.shape[-1]:
        values, index = torch.topk(logits, plan.candidates, dim=-1)
    else:
        values, index = torch.sort(logits, dim=-1, descending=True)
    if not plan.top_p:
        if pick is not None:
            return pick(values, index, temperature, top_k, keys, group, greedy, do_sample)
        return draw(values, index, temperature, top_k, keys, group, greedy, do_sample, scores)
    values = values / temperature
    keep = warp(values, top_k, top_p)
    return _race(values, keep, index, keys, group, greedy, do_sample, scores)


def draw(values, index, temperature, top_k, keys, group: int, greedy, do_sample, scores=None) -> torch.Tensor:
    """The draw of `choose` from its candidates where no row filters by top-p: `values` (B, K) sorted descending
    and their codes `index`, tempered, cut to each row's top-k, raced with Gumbel noise; `greedy` (B,) where
    `do_sample` is False. The contract of `choose`'s `pick` kernel."""
    values = values / temperature
    keep = warp(values, top_k, None)
    return _race(values, keep, index, keys, group, greedy, do_sample, scores)


def _race(values, keep, index, keys, group: int, greedy, do_sample, scores=None) -> torch.Tensor:
    """The Gumbel-max race among the kept candidates: each row's winner's code, or `greedy` where it is not
    sampling."""
    race = (scores or gumbel_scores)(values, keep, keys, group, index)
    sampled = index.gather(-1, race.argmax(-1, keepdim=True))[:, 0]
    return torch.where(do_sample, sampled, greedy)


def margin(logits: torch.Tensor) -> float:
    """Gap between the best and second-best logit of each row, minimum over rows (greedy robustness)."""
    top2 = torch.topk(logits.float(), 2).values
    return float((top2[..., 0] - top2[..., 1]).min())
