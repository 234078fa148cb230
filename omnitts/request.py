"""One synthesis request and the cloned voice it may use."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch


@dataclass
class Voice:
    """A cloned voice (Base checkpoints): speaker embedding, plus reference codes and text for ICL.

    `ref_codes` is None in x-vector-only mode. Build one with `TTS.clone_voice` (or let a request's
    `ref_audio` build it); reuse it across requests to encode the reference only once. `save` writes
    it to a file that `TTS.load_voice` reads back (format in voice.py).
    """

    x_vector: torch.Tensor  # (talker hidden,) float32
    ref_codes: torch.Tensor | None  # (frames, 16) int64
    ref_text: str | None
    checkpoint: str | None = None  # identity of the checkpoint that encoded it (voice.checkpoint_identity)
    meta: dict[str, str] = field(default_factory=dict)  # ref_audio, ref_seconds, checkpoint_name, ...

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None

    def save(self, path) -> Path:
        """Write this voice to `path` (.safetensors), atomically; see `voice.save_voice`."""
        from .voice import save_voice

        return save_voice(self, path)


@dataclass
class Request:
    """What to say and how. Which fields apply depends on the checkpoint kind:

    - CustomVoice: `speaker` (required), `instruct` (1.7B only);
    - VoiceDesign: `instruct` (the voice description);
    - Base: `voice` (a `Voice`, or the path of a saved voice file), or `ref_audio` + `ref_text` (ICL) /
      `ref_audio` + `x_vector_only=True`.

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
