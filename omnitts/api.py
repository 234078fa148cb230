"""The Python API: load a checkpoint, clone voices, synthesize.

    import omnitts
    tts = omnitts.load("Qwen3-TTS-12Hz-0.6B-CustomVoice")
    result = tts.synthesize("Hello there.", speaker="ryan", language="english")
    result.save("hello.wav")

This first API runs the one-request-at-a-time reference path. The library never prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .audio import load_reference, write_audio
from .config import config_summary
from .errors import RequestError
from .models.loader import Checkpoint, load_checkpoint
from .params import SamplingParams
from .prompt import PromptBuilder, resolve
from .reference import decode_codes, generate_codes
from .request import Request, Voice


@dataclass
class Result:
    """One synthesized utterance."""

    audio: np.ndarray  # float32 mono samples in [-1, 1]
    sample_rate: int
    codes: np.ndarray  # (frames, 16) int64
    finish_reason: str  # "eos" or "length"
    talker_margin: float
    predictor_margin: float
    id: str | None = None

    @property
    def frames(self) -> int:
        return int(self.codes.shape[0])

    @property
    def duration(self) -> float:
        return len(self.audio) / self.sample_rate

    def save(self, path) -> Path:
        """Write the audio (format from the suffix: .wav, .flac, .ogg), atomically."""
        write_audio(Path(path), self.audio, self.sample_rate)
        return Path(path)


class TTS:
    """A loaded checkpoint, ready to synthesize. Create with `omnitts.load`."""

    def __init__(self, ckpt: Checkpoint):
        self.ckpt = ckpt
        self.prompts = PromptBuilder(ckpt)

    @property
    def sample_rate(self) -> int:
        return self.ckpt.config.codec.output_sample_rate

    def info(self) -> dict:
        """Kind, size, speakers, languages and more, as a dict."""
        return {"path": str(self.ckpt.path), **config_summary(self.ckpt.config)}

    def default_params(self, greedy: bool = False, **overrides) -> SamplingParams:
        """Sampling parameters from the checkpoint's generation_config.json, with `overrides`."""
        params = SamplingParams.from_generation_config(self.ckpt.config.generation, **overrides)
        return params.greedy() if greedy else params

    @torch.inference_mode()
    def clone_voice(self, ref_audio, ref_text: str | None = None, x_vector_only: bool = False) -> Voice:
        """Encode a reference clip once (path or (samples, rate)) into a reusable `Voice`."""
        ckpt = self.ckpt
        if ckpt.config.model_type != "base":
            raise RequestError(f"ref_audio: voice cloning needs a Base checkpoint; this one is {ckpt.config.model_type}")
        if not x_vector_only and not (ref_text or "").strip():
            raise RequestError("ref_text: required for in-context cloning; give the transcript or set x_vector_only")
        codec_rate = ckpt.config.codec.input_sample_rate
        speaker_rate = ckpt.config.speaker_encoder.sample_rate
        wav = load_reference(ref_audio, codec_rate)
        spk_wav = wav if speaker_rate == codec_rate else load_reference((wav, codec_rate), speaker_rate)
        x_vector = ckpt.model.speaker_encoder.embed(spk_wav)
        codes = None if x_vector_only else ckpt.codec_encoder.encode(wav)
        return Voice(x_vector=x_vector.float().cpu(), ref_codes=codes, ref_text=None if x_vector_only else ref_text)

    def run(self, request: Request, params: SamplingParams) -> Result:
        """Synthesize one `Request` with explicit sampling parameters."""
        resolve(self.ckpt.config, request)  # fail on a bad request before encoding any audio
        voice = request.voice
        if voice is None and request.ref_audio is not None:
            voice = self.clone_voice(request.ref_audio, request.ref_text, request.x_vector_only)
        prompt = self.prompts.build(request, voice)
        generation = generate_codes(self.ckpt, prompt, params)
        audio = decode_codes(self.ckpt, generation.codes, prompt.ref_codes)
        return Result(audio, self.sample_rate, generation.codes.numpy(), generation.finish_reason,
                      generation.talker_margin, generation.predictor_margin, request.id)

    def synthesize(self, text: str, *, language: str = "auto", speaker: str | None = None,
                   instruct: str | None = None, ref_audio=None, ref_text: str | None = None,
                   x_vector_only: bool = False, voice: Voice | None = None, non_streaming: bool | None = None,
                   greedy: bool = False, max_frames: int | None = None, seed: int | None = None,
                   **sampling) -> Result:
        """Speak `text`. See `Request` for which fields each checkpoint kind takes.

        `greedy` takes the most likely code at every step (deterministic); otherwise codes are
        sampled with the checkpoint's defaults, overridable by keyword (`temperature`, `top_k`,
        `top_p`, `repetition_penalty`, `subtalker_*`). `max_frames` caps the length (12.5 frames/s).
        """
        request = Request(text, language, speaker, instruct, ref_audio, ref_text, x_vector_only, voice, non_streaming)
        params = self.default_params(greedy, max_frames=max_frames, seed=seed, **sampling)
        return self.run(request, params)


def load(path, device: str = "cpu", dtype: str = "float32", official_tokenizer: bool = False) -> TTS:
    """Load a Qwen3-TTS-12Hz checkpoint directory (CustomVoice, VoiceDesign or Base; 0.6B or 1.7B).

    `dtype` (float32, bfloat16, float16) applies to the language models; the codec always runs in
    float32. `official_tokenizer=True` reproduces the official package's token ids (see tokenizer.py).
    """
    return TTS(load_checkpoint(path, device=device, dtype=dtype, official_tokenizer=official_tokenizer))
