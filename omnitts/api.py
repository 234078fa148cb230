"""The Python API: load a checkpoint, clone voices, synthesize.

    import omnitts
    tts = omnitts.load("Qwen3-TTS-12Hz-0.6B-CustomVoice")
    result = tts.synthesize("Hello there.", speaker="ryan", language="english")
    result.save("hello.wav")

Requests run through the continuous-batching engine (`generate` takes many at once and yields
results as they finish); `run_reference` keeps the one-request slow path that the engine is tested
against. The library never prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch

from .audio import load_reference, write_audio
from .config import config_summary
from .errors import OmniTTSError, RequestError, VoiceError
from .models.loader import Checkpoint, load_checkpoint
from .params import SamplingParams
from .pipeline import Job, Pipeline
from .prompt import Prompt, PromptBuilder, resolve
from .reference import decode_codes, generate_codes
from .request import Request, Voice
from .voice import checkpoint_identity, load_voice

KV_BUDGET_BYTES = 4 * 2**30  # default talker-cache budget of one generate() call


@dataclass
class Result:
    """One synthesized utterance."""

    audio: np.ndarray  # float32 mono samples in [-1, 1]
    sample_rate: int
    codes: np.ndarray  # (frames, 16) int64
    finish_reason: str  # "eos" or "length"
    id: str | None = None
    talker_margin: float | None = None  # smallest greedy top-1/top-2 gaps (reference path only)
    predictor_margin: float | None = None

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

    def __init__(self, ckpt: Checkpoint, max_batch: int = 8, eager: bool = False,
                 kv_budget_bytes: int = KV_BUDGET_BYTES):
        self.ckpt = ckpt
        self.prompts = PromptBuilder(ckpt)
        self.max_batch = max_batch
        self.eager = eager
        self.kv_budget_bytes = kv_budget_bytes
        self._identity: str | None = None
        self._voices: dict[Path, Voice] = {}  # saved voices by resolved path (a manifest loads each once)

    @property
    def sample_rate(self) -> int:
        return self.ckpt.config.codec.output_sample_rate

    @property
    def identity(self) -> str:
        """This checkpoint's identity, which saved voices are tied to (computed once; see voice.py)."""
        if self._identity is None:
            self._identity = checkpoint_identity(self.ckpt.path)
        return self._identity

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
        meta = {"ref_audio": "" if isinstance(ref_audio, tuple) else Path(ref_audio).name,
                "ref_seconds": f"{len(wav) / codec_rate:.3f}", "checkpoint_name": ckpt.path.name}
        return Voice(x_vector=x_vector.float().cpu(), ref_codes=codes, ref_text=None if x_vector_only else ref_text,
                     checkpoint=self.identity, meta=meta)

    def load_voice(self, path) -> Voice:
        """Read a saved voice file (see `Voice.save`), refusing one made with another checkpoint."""
        key = Path(path).expanduser().resolve()
        if key in self._voices:
            return self._voices[key]
        voice, meta = load_voice(path)
        if self.ckpt.config.model_type != "base":
            raise RequestError(f"voice: {path}: saved voices need a Base checkpoint; this one is "
                               f"{self.ckpt.config.model_type}")
        if voice.checkpoint != self.identity:
            made_with = voice.checkpoint + (f" ({meta['checkpoint_name']})" if meta.get("checkpoint_name") else "")
            raise VoiceError(f"{path}: this voice was made with checkpoint {made_with}, not with "
                             f"{self.ckpt.path} ({self.identity}); re-create it with "
                             f"`omnitts voice-clone --model {self.ckpt.path} --save ...`")
        hidden, groups = self.ckpt.config.talker.hidden_size, self.ckpt.config.talker.num_code_groups
        if voice.x_vector.shape[0] != hidden or (voice.icl and voice.ref_codes.shape[1] != groups):
            raise VoiceError(f"{path}: tensor shapes do not fit this checkpoint (x_vector of {hidden}, "
                             f"ref_codes of {groups} groups expected)")
        self._voices[key] = voice
        return voice

    def prepare(self, request: Request) -> Prompt:
        """Check `request`, encode its reference audio if any, and build its prompt."""
        resolve(self.ckpt.config, request)  # fail on a bad request before encoding any audio
        voice = request.voice
        if isinstance(voice, (str, Path)):
            voice = self.load_voice(voice)
        elif voice is not None and voice.checkpoint is not None and voice.checkpoint != self.identity:
            raise VoiceError(f"voice: made with checkpoint {voice.checkpoint}, not with {self.ckpt.path} "
                             f"({self.identity}); clone it again with this checkpoint")
        elif voice is None and request.ref_audio is not None:
            voice = self.clone_voice(request.ref_audio, request.ref_text, request.x_vector_only)
        return self.prompts.build(request, voice)

    def generate(self, jobs: Iterable[tuple[Request, SamplingParams]]) -> Iterator[Result]:
        """Synthesize many requests together (continuous batching); yield each result as it finishes.

        `jobs` is read lazily, a few batches ahead of the engine, so it may be a long generator.
        A request that cannot be prepared (bad reference audio, unknown speaker...) raises.
        """
        for outcome in Pipeline(self).run(Job(request, params) for request, params in jobs):
            if not outcome.ok:
                raise outcome.exception
            yield outcome.result

    def generate_prepared(self, prepared: Iterable[tuple[Request, Prompt, SamplingParams]]) -> Iterator[Result]:
        """`generate` for requests already turned into prompts (see `prepare`)."""
        jobs = (Job(request, params, prompt=prompt) for request, prompt, params in prepared)
        for outcome in Pipeline(self).run(jobs):
            yield outcome.result

    def run(self, request: Request, params: SamplingParams) -> Result:
        """Synthesize one `Request` with explicit sampling parameters."""
        return next(self.generate([(request, params)]))

    def run_reference(self, request: Request, params: SamplingParams) -> Result:
        """The one-request eager slow path (what the engine is tested against), with greedy margins."""
        prompt = self.prepare(request)
        generation = generate_codes(self.ckpt, prompt, params.with_budget(prompt.text_tokens, request.max_seconds))
        audio = decode_codes(self.ckpt, generation.codes, prompt.ref_codes)
        return Result(audio, self.sample_rate, generation.codes.numpy(), generation.finish_reason, request.id,
                      generation.talker_margin, generation.predictor_margin)

    def synthesize(self, text: str | list[str], *, language: str = "auto", speaker: str | None = None,
                   instruct: str | None = None, ref_audio=None, ref_text: str | None = None,
                   x_vector_only: bool = False, voice: Voice | str | Path | None = None,
                   non_streaming: bool | None = None, greedy: bool = False, max_frames: int | None = None,
                   seed: int | None = None, **sampling) -> Result | list[Result]:
        """Speak `text` (a string, or a list of strings batched together). See `Request` for which
        fields each checkpoint kind takes.

        `greedy` takes the most likely code at every step (deterministic); otherwise codes are
        sampled with the checkpoint's defaults, overridable by keyword (`temperature`, `top_k`,
        `top_p`, `repetition_penalty`, `subtalker_*`). `max_frames` caps the length (12.5 frames/s).
        With a list and a `seed`, item i uses seed + i. Reference audio is encoded once for a list.
        """
        texts = [text] if isinstance(text, str) else list(text)
        if ref_audio is not None and voice is None and len(texts) > 1:
            voice = self.clone_voice(ref_audio, ref_text, x_vector_only)
        jobs = []
        for i, item in enumerate(texts):
            request = Request(item, language, speaker, instruct, ref_audio, ref_text, x_vector_only, voice,
                              non_streaming, id=str(i))
            item_seed = None if seed is None else seed + i
            jobs.append((request, self.default_params(greedy, max_frames=max_frames, seed=item_seed, **sampling)))
        results = {result.id: result for result in self.generate(jobs)}
        ordered = [results[str(i)] for i in range(len(texts))]
        return ordered[0] if isinstance(text, str) else ordered


def load(path, device: str = "cpu", dtype: str = "float32", official_tokenizer: bool = False,
         max_batch: int = 8, eager: bool = False) -> TTS:
    """Load a Qwen3-TTS-12Hz checkpoint directory (CustomVoice, VoiceDesign or Base; 0.6B or 1.7B).

    `device`: cpu, cuda or npu. `dtype` (float32, bfloat16, float16) applies to the language models;
    the codec always runs in float32. `max_batch` caps how many requests decode together; `eager`
    turns graph capture off (also OMNITTS_EAGER=1). `official_tokenizer=True` reproduces the
    official package's token ids (see tokenizer.py).
    """
    if device == "npu":
        from .device.npu import import_torch_npu

        import_torch_npu()  # before any tensor goes to the NPU
    elif device == "cuda" and not torch.cuda.is_available():
        raise OmniTTSError("device cuda: no CUDA device is visible to torch (use --device cpu)")
    elif device not in ("cpu", "cuda"):
        raise OmniTTSError(f"device {device!r}: choose cpu, cuda or npu")
    ckpt = load_checkpoint(path, device=device, dtype=dtype, official_tokenizer=official_tokenizer)
    return TTS(ckpt, max_batch=max_batch, eager=eager)
