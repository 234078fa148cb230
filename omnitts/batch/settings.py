"""A manifest run's settings: how it synthesizes and writes (the synth command's flags, the `--ray` stage's
arguments), given to its `Batch` (outdir.py) and, under `--workers`, to every worker (workers.Plan).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Settings:
    """How a manifest run synthesizes and writes.

    Per-item fields override the first three: a line's `seed` its seed, and a line's `max_seconds`
    its frame budget (`max_frames` is the budget of the lines without one).
    """

    greedy: bool = False
    max_frames: int | None = None
    seed: int | None = None
    save_codes: bool = False
    format: str = "wav"
    retry_failed: bool = False
    force: bool = False  # redo every item, done ones included (each file is replaced atomically)
    retry_runaway: int = 0
    loudness: float | None = None  # target LUFS, None = leave levels alone
    split_chars: int | None = None  # long-text threshold (None: text_split's default; 0: never split)
    official_tokenizer: bool = False  # what the engine tokenizes with (load's flag): in the fingerprint

    def splitter(self):
        """The pipeline's `split(text, language)` for these settings."""
        from ..text.split import split_text

        if self.split_chars == 0:
            return lambda text, language: [text]
        return lambda text, language: split_text(text, max_chars=self.split_chars, language=language)
