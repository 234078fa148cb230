"""One synthesis request: what to say, in which voice, and how."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .voice import Voice

__all__ = ["Request", "Voice"]  # Voice lives in voice.py; importable from here as before


@dataclass
class Request:
    """What to say and how. Which fields apply depends on the checkpoint kind:

    - CustomVoice: `speaker` (required), `instruct` (1.7B only);
    - VoiceDesign: `instruct` (the voice description);
    - Base: `voice` (a `Voice`, or the path of a saved voice file), or `ref_audio` + `ref_text` (ICL) /
      `ref_audio` + `x_vector_only=True`. Beside a `voice`, `ref_text` is refused (the voice keeps the
      transcript it was saved with), and `x_vector_only=True` runs only for a voice saved x-vector only.

    `language` is a language name the checkpoint knows, or "auto". `non_streaming` picks the text
    mode (None = the official default: non-streaming for CustomVoice/VoiceDesign, streaming for Base).
    """

    text: str
    language: str = "auto"
    speaker: str | None = None
    instruct: str | None = None
    ref_audio: str | Path | tuple[np.ndarray, int] | None = None
    ref_text: str | None = None
    x_vector_only: bool = False
    voice: Voice | str | Path | None = None
    non_streaming: bool | None = None
    id: str | None = None
    max_seconds: float | None = None  # frame budget in seconds (when max_frames is not set)

    def __post_init__(self):
        if isinstance(self.max_seconds, (np.integer, np.floating)):  # numpy's, as the API's numbers are taken
            self.max_seconds = self.max_seconds.item()
