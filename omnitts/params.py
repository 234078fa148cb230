"""Per-request sampling parameters (the official semantics), separate from engine-wide settings."""

from __future__ import annotations

import hashlib
import numbers
import random
from dataclasses import dataclass, fields, replace

import torch

from .errors import did_you_mean, type_label
from .sampling import seed_word

FRAMES_PER_SECOND = 12.5
GUARD_BASE_FRAMES, GUARD_FRAMES_PER_TOKEN = 40, 10  # runaway guard (see SamplingParams.with_budget)
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# The largest value of each number a request may set: the sampling values become float32 (and top_k an
# int64) on the device; a budget in seconds beyond any checkpoint's frame cap is cut to the cap anyway.
LARGEST = dict(temperature=FLOAT32_MAX, subtalker_temperature=FLOAT32_MAX, repetition_penalty=FLOAT32_MAX,
               top_p=1.0, subtalker_top_p=1.0, top_k=2**63 - 1, subtalker_top_k=2**63 - 1, max_seconds=FLOAT32_MAX)

# The official wrapper's hard defaults, used where generation_config.json is silent.
_DEFAULTS = dict(
    do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
    subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9,
)


def derive_seed(seed: int | None, salt: str, index: int) -> int | None:
    """A seed derived from `seed` for sub-task `index` of kind `salt` ("piece", "retry"); in [0, 2**63).

    Index 0 keeps `seed` itself (so an unsplit, first-attempt item uses exactly its own seed) and
    None stays None (unseeded).
    """
    if index < 0:
        raise ValueError(f"{salt} index must be >= 0, got {index}")
    if seed is None or index == 0:
        return seed
    digest = hashlib.blake2b(f"omnitts-{salt}:{int(seed)}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # non-negative, so it fits a signed int64


def share_frames(total: int, weights: list[int]) -> list[int]:
    """Split a frame budget of `total` among pieces in proportion to `weights` (their text tokens).

    Every piece gets one frame, the other `total - len(weights)` go by largest remainder in
    proportion to the weights (ties to the earlier piece), so the shares add up to `total` exactly.
    Needs `total >= len(weights)` (one frame per piece at least).
    """
    count = len(weights)
    if not 1 <= count <= total:
        raise ValueError(f"cannot share {total} frames among {count} pieces (one each at least)")
    weights = [max(int(w), 0) for w in weights]
    if not any(weights):
        weights = [1] * count
    spare, weight = total - count, sum(weights)
    exact = [spare * w / weight for w in weights]
    shares = [int(e) for e in exact]
    order = sorted(range(count), key=lambda i: (shares[i] - exact[i], i))  # largest remainder first
    for i in order[: spare - sum(shares)]:
        shares[i] += 1
    return [1 + s for s in shares]


def fresh_seed() -> int:
    """A seed for a request that samples without one (drawn on the host at admission, never per frame).

    31 bits, as the pipeline records them, so a logged seed is easy to pass back.
    """
    return random.SystemRandom().randrange(2**31)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick codes for one request.

    Talker (codebook 0): `do_sample`, `temperature`, `top_k`, `top_p`, `repetition_penalty` (over the
    codebook-0 codes generated so far). Sub-talker (codebooks 1..15): the `subtalker_*` fields, no penalty.
    `max_frames` is the frame budget (80 ms each); None derives it from the text (the runaway
    guard, see `with_budget`), never above `frame_cap` (generation_config's max_new_tokens - 1; >= 1).
    `seed` makes sampling reproducible: a signed 64-bit integer (`SEEDS`), keying the noise (omnitts.sampling).
    """

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_frames: int | None = None
    seed: int | None = None
    frame_cap: int = 8191

    def __post_init__(self):
        for name, kind in _KINDS.items():
            value = getattr(self, name)
            if type(value) in _EXACT[kind] or (value is None and name in ("max_frames", "seed")):
                continue  # the common case: a plain bool, int or float passes the checks below unchanged
            if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
                expected = {bool: "a bool", INT: "an int", NUMBER: "a number"}[kind]
                raise TypeError(f"{name}: expected {expected}, got {type_label(type(value))}")
            if kind is not bool and type(value) not in (int, float):  # numpy's: their arithmetic wraps (int32)
                object.__setattr__(self, name, int(value) if kind is INT else float(value))
        for name in ("temperature", "subtalker_temperature", "repetition_penalty"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        for name in ("top_p", "subtalker_top_p"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be in (0, 1], got {getattr(self, name)}")
        for name in ("top_k", "subtalker_top_k"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0 (0 = off), got {getattr(self, name)}")
        for name in ("temperature", "subtalker_temperature", "repetition_penalty", "top_k", "subtalker_top_k"):
            if getattr(self, name) > LARGEST[name]:
                raise ValueError(f"{name}: must be at most {LARGEST[name]:.4g}, got {getattr(self, name)}")
        if self.max_frames is not None and self.max_frames < 1:
            raise ValueError(f"max_frames: must be >= 1, got {self.max_frames}")
        if problem := seed_problem(self.seed):
            raise ValueError(f"seed: {problem}")
        if self.frame_cap < 1:  # the most frames any budget is cut to: one at least, as from_generation_config makes
            raise ValueError(f"frame_cap: must be >= 1 (the most frames one utterance may take), got {self.frame_cap}")

    @classmethod
    def from_generation_config(cls, gen: dict, **overrides) -> "SamplingParams":
        """Defaults from a checkpoint's generation_config.json, then `overrides` (None = keep)."""
        values = {k: gen.get(k, v) for k, v in _DEFAULTS.items()}
        # Official max_new_tokens counts codebook-0 tokens; the last one never gets a frame.
        tokens = gen.get("max_new_tokens", 2048)
        if isinstance(tokens, bool) or not isinstance(tokens, INT) or tokens < 1:
            raise ValueError(f"max_new_tokens: must be an integer >= 1, got {tokens!r}")
        values["frame_cap"] = max(1, int(tokens) - 1)
        names = {f.name for f in fields(cls)} - {"frame_cap"}  # the checkpoint's cap, not a request's to raise
        if "frame_cap" in overrides:
            raise ValueError(f"frame_cap: this checkpoint's ({values['frame_cap']} frames, from generation_config.json's "
                             "max_new_tokens), not a request's; set max_frames (or max_seconds) below it")
        if unknown := sorted(set(overrides) - names):
            raise ValueError(f"unknown sampling parameter(s) {unknown}{did_you_mean(unknown[0], sorted(names))}; "
                             f"valid: {sorted(names)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def samples(self) -> bool:
        """Whether any choice is random (then the request needs a seed)."""
        return self.do_sample or self.subtalker_dosample

    def with_budget(self, text_tokens: int, max_seconds: float | None = None) -> "SamplingParams":
        """These parameters with a definite `max_frames`.

        Explicit `max_frames` wins; otherwise `max_seconds` if given, else the runaway guard: a
        generous allowance for the text (40 frames plus 10 per text token, several times normal
        speech), so a model that never says EOS stops instead of running for minutes.
        """
        if self.max_frames is not None:
            frames = self.max_frames
        elif max_seconds is not None:
            frames = frames_in(max_seconds)
        else:
            frames = GUARD_BASE_FRAMES + GUARD_FRAMES_PER_TOKEN * text_tokens
        return replace(self, max_frames=min(frames, self.frame_cap))

    def greedy(self) -> "SamplingParams":
        """Argmax in talker and sub-talker (penalty and suppression still apply, as officially)."""
        return replace(self, do_sample=False, subtalker_dosample=False)


NUMBER, INT = numbers.Real, numbers.Integral  # numpy's numbers too
_KINDS = dict(do_sample=bool, temperature=NUMBER, top_k=INT, top_p=NUMBER, repetition_penalty=NUMBER,
              subtalker_dosample=bool, subtalker_temperature=NUMBER, subtalker_top_k=INT, subtalker_top_p=NUMBER,
              max_frames=INT, seed=INT, frame_cap=INT)  # SamplingParams' fields' types, checked at construction
_EXACT = {bool: (bool,), NUMBER: (int, float), INT: (int,)}  # the types of each kind that are kept as they are


def check_seed(seed) -> None:
    """A seed is an int or None (TypeError otherwise, before any arithmetic on it), of 64 bits (ValueError)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, INT)):
        raise TypeError(f"seed: expected an int, got {type_label(type(seed))}")
    if problem := seed_problem(seed):
        raise ValueError(f"seed: {problem}")


SEEDS = (-(2**63), 2**63 - 1)  # a seed is a signed 64-bit integer: what results.jsonl's readers (Parquet, Arrow) hold


def seed_problem(seed) -> str | None:
    """Why int `seed` cannot be a seed (outside SEEDS), or None. Within them every seed keys its own noise."""
    if seed is not None and not SEEDS[0] <= seed <= SEEDS[1]:
        return f"must be a 64-bit integer, from -2**63 to 2**63 - 1, got {seed}"
    return None


def check_flag(name: str, value) -> None:
    """A flag such as `greedy` is a bool (TypeError naming it otherwise: "yes" would count as true)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type_label(type(value))}")


def frames_in(seconds: float) -> int:
    """A budget of `seconds` in frames: at least one; an enormous one is cut to 2**31 (past any frame cap)."""
    return max(1, round(min(seconds * FRAMES_PER_SECOND, 2**31)))


def share_problem(name: str, frames: int, pieces: int) -> str | None:
    """Why an item's budget of `frames` (given as `name`: max_frames or max_seconds) cannot be shared by its
    `pieces`, one frame each at least (None: it can)."""
    if frames >= pieces:
        return None
    return (f"{name}: the item's budget of {frames} frame{'' if frames == 1 else 's'} cannot be shared by its "
            f"{pieces} pieces (one frame each at least); raise the budget or split the line")


def put(tensor: torch.Tensor, row: int, value) -> None:
    """`tensor[row] = value` for a host number, without a host sync on a device.

    `t[row] = 3` on a 1-D CUDA tensor (a single element) copies the number to the device from pageable
    memory and waits for the stream (torch 2.11 on an H200, under `set_sync_debug_mode`); `fill_` on the
    row's slice passes it as a kernel argument instead.
    """
    tensor[row:row + 1].fill_(value)


@dataclass
class RowParams:
    """Per-row sampling parameters as tensors, so one batch mixes requests without host syncs.

    Shapes: flags (B,); temperatures, top-p, penalty (B, 1) float32; top-k, seed (B, 1) int64
    (the seed as `sampling.seed_word` stores it; 0 for requests that never sample).
    """

    do_sample: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    penalty: torch.Tensor
    sub_do_sample: torch.Tensor
    sub_temperature: torch.Tensor
    sub_top_k: torch.Tensor
    sub_top_p: torch.Tensor
    seed: torch.Tensor

    @classmethod
    def empty(cls, rows: int, device=None) -> "RowParams":
        flag = lambda: torch.zeros(rows, dtype=torch.bool, device=device)  # noqa: E731
        real = lambda: torch.ones((rows, 1), dtype=torch.float32, device=device)  # noqa: E731
        count = lambda: torch.zeros((rows, 1), dtype=torch.long, device=device)  # noqa: E731
        return cls(flag(), real(), count(), real(), real(), flag(), real(), count(), real(), count())

    @classmethod
    def of(cls, params: list[SamplingParams], device=None) -> "RowParams":
        rows = cls.empty(len(params), device)
        for i, p in enumerate(params):
            rows.set(i, p)
        return rows

    def set(self, row: int, p: SamplingParams) -> None:
        """Write request parameters `p` into `row` (fills with the values as kernel arguments: no copy, no sync)."""
        for tensor, value in ((self.do_sample, p.do_sample), (self.temperature, p.temperature),
                              (self.top_k, p.top_k), (self.top_p, p.top_p), (self.penalty, p.repetition_penalty),
                              (self.sub_do_sample, p.subtalker_dosample),
                              (self.sub_temperature, p.subtalker_temperature),
                              (self.sub_top_k, p.subtalker_top_k), (self.sub_top_p, p.subtalker_top_p),
                              (self.seed, seed_word(p.seed))):
            put(tensor, row, value)

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, f.name) for f in fields(self)]

    def select(self, rows: slice) -> "RowParams":
        """Views of `rows` of every parameter (no copy)."""
        return RowParams(*(t[rows] for t in self.tensors()))
