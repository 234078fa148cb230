"""Per-request sampling parameters (the official semantics), separate from engine-wide settings."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

# The official wrapper's hard defaults, used where generation_config.json is silent.
_DEFAULTS = dict(
    do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
    subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9,
)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick codes for one request.

    Talker (codebook 0): `do_sample`, `temperature`, `top_k`, `top_p`, `repetition_penalty` (over the
    codebook-0 codes generated so far). Sub-talker (codebooks 1..15): the `subtalker_*` fields, no penalty.
    `max_frames` is the frame budget (80 ms each); `seed` makes sampling reproducible.
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
    max_frames: int = 2047
    seed: int | None = None

    def __post_init__(self):
        for name in ("temperature", "subtalker_temperature", "repetition_penalty"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("top_p", "subtalker_top_p"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("top_k", "subtalker_top_k"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = off), got {getattr(self, name)}")
        if self.max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {self.max_frames}")

    @classmethod
    def from_generation_config(cls, gen: dict, **overrides) -> "SamplingParams":
        """Defaults from a checkpoint's generation_config.json, then `overrides` (None = keep)."""
        values = {k: gen.get(k, v) for k, v in _DEFAULTS.items()}
        # Official max_new_tokens counts codebook-0 tokens; the last one never gets a frame.
        values["max_frames"] = max(1, int(gen.get("max_new_tokens", 2048)) - 1)
        names = {f.name for f in fields(cls)}
        unknown = set(overrides) - names
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {sorted(unknown)}; valid: {sorted(names)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def greedy(self) -> "SamplingParams":
        """Argmax in talker and sub-talker (penalty and suppression still apply, as officially)."""
        return replace(self, do_sample=False, subtalker_dosample=False)
