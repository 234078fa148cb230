"""A loaded checkpoint, ready to synthesize: `TTS` (made by `api.load`).

Requests run through the continuous-batching engine (`stream` and `generate` take many at once and
yield results as they finish); `run_reference` keeps the one-request slow path that the engine is
tested against. What each method is given is checked in arguments.py. The library never prints.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Iterator

import torch

from .arguments import (StreamItem, check_deterministic, check_job, check_reference, check_request, naming,
                        numbered_job, python_int, requests_iterator, stream_item)
from .checkpoint import Checkpoint
from .engine import EngineConfig
from .engine.pipeline import Job, Pipeline
from .engine.reference import decode_codes, generate_codes
from .errors import AudioError, OmniTTSError, RequestError, VoiceError
from .info import checkpoint_info
from .io import user_path
from .io.audio import load_reference
from .params import SamplingParams, check_flag, check_seed, fresh_seed
from .request import Request, Voice
from .result import Audio
from .sampling import seed_word
from .text import empty_text, no_transcript
from .text.prompt import Prompt, PromptBuilder, not_text, resolve
from .voice import check_fits, check_voice, checkpoint_identity, load_voice

_END = object()  # the end of `stream`'s requests
KV_BUDGET_BYTES = 4 * 2**30  # default talker-cache budget of one generate() call


class TTS:
    """A loaded checkpoint, ready to synthesize. Create one with `omnitts.load`.

    Args:
        ckpt: the loaded checkpoint (models, tokenizer, config).
        max_batch: how many requests decode together at most (continuous batching).
        eager: never capture device graphs (cuda/npu); CPU always runs eagerly.
        kv_budget_bytes: talker K/V cache budget of one engine run; fewer slots are used if needed.
        graph_buckets: batch sizes that get a captured graph (None: 1, 2, 4, ...; max_batch always).
        span_buckets: attention spans that get a graph per batch size (None: 256, 512, ...).
        max_prefill_tokens: prompt positions admitted per engine step at most (None: no limit).
        deterministic: the codec one stream per call and, on graph devices, every frame at the engine's
            full batch, so a line's audio does not depend on its batch mates (see `omnitts.load`; the
            device side is `device.make_deterministic`, which `load` applies). Excludes `graph_buckets`.
    """

    def __init__(self, ckpt: Checkpoint, max_batch: int = 8, eager: bool = False,
                 kv_budget_bytes: int = KV_BUDGET_BYTES, graph_buckets: list[int] | None = None,
                 codec_chunk_frames: int = 25, span_buckets: list[int] | None = None,
                 max_prefill_tokens: int | None = EngineConfig.max_prefill_tokens, deterministic: bool = False):
        check_deterministic(deterministic, graph_buckets)
        self.ckpt = ckpt
        self.deterministic = deterministic
        self.span_buckets = span_buckets
        self.max_prefill_tokens = max_prefill_tokens
        self.codec_chunk_frames = codec_chunk_frames
        self.prompts = PromptBuilder(ckpt)
        self.max_batch = max_batch
        self.eager = eager
        self.kv_budget_bytes = kv_budget_bytes
        self._identity: str | None = None
        # Saved voices by resolved path, with the file's stamp when read: a manifest loads each once, and a file
        # written over (or deleted) since is read again (or refused), never served from memory.
        self._voices: dict[Path, tuple[tuple[int, int, int], Voice]] = {}
        self.graph_buckets = graph_buckets
        # The last run's engine on a graph device, idle, for the next call to reuse with its captured graphs
        # (see engine.pipeline); `release_engine()` frees its memory.
        self.idle_engine = None

    def release_engine(self) -> None:
        """Free the engine kept from the last call (its K/V cache and graphs) on cuda/npu; the next call
        builds a new one and captures its graphs again. Nothing is kept on the CPU."""
        self.idle_engine = None

    @property
    def sample_rate(self) -> int:
        """Output samples per second (24000)."""
        return self.ckpt.config.codec.output_sample_rate

    @property
    def identity(self) -> str:
        """This checkpoint's identity, which saved voices are tied to (computed once; see voice.py)."""
        if self._identity is None:
            self._identity = checkpoint_identity(self.ckpt.path)
        return self._identity

    def __repr__(self) -> str:
        """What a notebook shows for a loaded model: its checkpoint and kind, and what it runs on."""
        ckpt = self.ckpt
        codec = next(ckpt.codec.parameters()).dtype
        return (f"TTS({str(ckpt.path)!r}, {ckpt.config.model_type}, {ckpt.device.type}, "
                f"{str(ckpt.dtype).removeprefix('torch.')}, codec {str(codec).removeprefix('torch.')}, "
                f"max_batch={self.max_batch})")

    def info(self) -> dict:
        """Describe the checkpoint: kind, size, parameter counts, speakers, languages, defaults.

        Returns:
            A dict with `path`, `kind` (custom_voice | voice_design | base), `size` (from the shapes:
            "0.6B", "1.7B", "tiny" or "custom"), `config_size` (what the config names it),
            `parameters` and `codec_parameters` (exact counts), `speakers` and `dialects` (speaker ->
            dialect), `languages` ("auto" first), `accepts_instruct`, `sample_rate`, `frame_rate`,
            `sampling` (the default sampling parameters) and `max_frames`, plus layer sizes. See
            `omnitts.info.checkpoint_info`.
        """
        return checkpoint_info(self.ckpt.path, self.ckpt.config)

    def default_params(self, greedy: bool = False, **overrides) -> SamplingParams:
        """Sampling parameters from the checkpoint's generation_config.json, with `overrides`.

        Args:
            greedy: argmax decoding in talker and sub-talker instead of sampling (a bool).
            **overrides: any `SamplingParams` field (None keeps the default).
        """
        check_flag("greedy", greedy)
        params = SamplingParams.from_generation_config(self.ckpt.config.generation, **overrides)
        return params.greedy() if greedy else params

    @torch.inference_mode()
    def clone_voice(self, ref_audio, ref_text: str | None = None, x_vector_only: bool = False) -> Voice:
        """Encode a reference clip once into a reusable `Voice` (Base checkpoints only).

        Args:
            ref_audio: a path to an audio file (`~` is the home folder), or a `(samples, sample_rate)` pair:
                float samples in [-1, 1] (past ±2, integer PCM cast to float, refused), or integer PCM as
                `scipy.io.wavfile.read` returns it (int16, int32, int8, uint8), scaled to [-1, 1) as soundfile
                scales it (int16 / 2**15, ...); other integer types (int64, uint16, ...) are refused. Mono, shape
                (n,), or (n, channels).
            ref_text: what the clip says (required unless `x_vector_only`).
            x_vector_only: keep only the speaker embedding (no in-context reference codes). A clip over
                30 s is then cut to its first 30 s with a UserWarning (in-context cloning refuses it).
        """
        from .batch.manifest import check_fields

        ckpt = self.ckpt
        if ckpt.config.model_type != "base":
            raise RequestError(f"ref_audio: voice cloning needs a Base checkpoint; this one is {ckpt.config.model_type}")
        check_reference(ref_audio)
        check_fields({"ref_text": ref_text, "x_vector_only": x_vector_only})  # types; a lone surrogate is no text
        if not x_vector_only and no_transcript(ref_text):
            raise RequestError("ref_text: required for in-context cloning; give the transcript or set x_vector_only")
        codec_rate = ckpt.config.codec.input_sample_rate
        speaker_rate = ckpt.config.speaker_encoder.sample_rate
        try:
            wav = load_reference(ref_audio, codec_rate, truncate=x_vector_only)
        except AudioError as exc:  # a clip's path: the field's name first, as in every other request error
            if isinstance(ref_audio, tuple):  # (samples, rate): its messages begin with the field already
                raise
            raise AudioError(f"ref_audio: {exc}") from None
        spk_wav = wav if speaker_rate == codec_rate else load_reference((wav, codec_rate), speaker_rate, truncate=True)
        x_vector = ckpt.model.speaker_encoder.embed(spk_wav)
        codes = None if x_vector_only else ckpt.codec_encoder.encode(wav)
        meta = {"ref_audio": "" if isinstance(ref_audio, tuple) else Path(ref_audio).name,
                "ref_seconds": f"{len(wav) / codec_rate:.3f}", "checkpoint_name": ckpt.path.name}
        return Voice(x_vector=x_vector.float().cpu(), ref_codes=codes, ref_text=None if x_vector_only else ref_text,
                     checkpoint=self.identity, meta=meta)

    def load_voice(self, path) -> Voice:
        """Read a saved voice file (see `Voice.save`; `~` is the home folder), refusing one made with another
        checkpoint."""
        key = user_path(path).resolve()
        try:
            stat = key.stat()
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        except OSError:
            stamp = None  # gone (load_voice says so)
        cached = self._voices.pop(key, None)
        if cached is not None and cached[0] == stamp:
            self._voices[key] = cached
            return cached[1]
        voice, meta = load_voice(path)
        if self.ckpt.config.model_type != "base":
            raise RequestError(f"voice: {path}: saved voices need a Base checkpoint; this one is "
                               f"{self.ckpt.config.model_type}")
        check_voice(voice, meta, path, self.identity, self.ckpt.config)
        if stamp is not None:
            self._voices[key] = (stamp, voice)
        return voice

    def prepare(self, request: Request) -> Prompt:
        """Check `request` against the checkpoint, encode its reference audio if any, build its prompt.

        Raises:
            RequestError: `request` is not a `Request`, or does not fit the checkpoint (names the field).
            AudioError: the reference audio cannot be used.
        """
        if not isinstance(request, Request):
            raise RequestError(f"request: expected a Request, got {type(request).__name__}")
        resolve(self.ckpt.config, request)  # fail on a bad request before encoding any audio
        voice = request.voice
        if voice is not None:
            voice = self.usable_voice(voice)
        elif request.ref_audio is not None:
            voice = self.clone_voice(request.ref_audio, request.ref_text, request.x_vector_only)
        return self.prompts.build(request, voice)

    def usable_voice(self, voice: Voice | str | os.PathLike) -> Voice:
        """A request's `voice` ready to speak with: a file's path read (`load_voice`), a Voice checked against
        this checkpoint (its identity, its tensors' shapes and ranges). VoiceError naming `voice` otherwise."""
        if isinstance(voice, (str, os.PathLike)):  # any path `check_request` takes, not only a pathlib one
            return self.load_voice(voice)
        if voice.checkpoint is not None and voice.checkpoint != self.identity:
            raise VoiceError(f"voice: made with checkpoint {voice.checkpoint}, not with {self.ckpt.path} "
                             f"({self.identity}); clone it again with this checkpoint")
        check_fits(voice, self.ckpt.config, "voice")
        if voice.icl and voice.ref_codes.dtype != torch.long:  # int16 codes (a compact array) index no embedding
            voice = replace(voice, ref_codes=voice.ref_codes.long())
        return voice

    def generate(self, jobs: Iterable[tuple[Request, SamplingParams]]) -> Iterator[Audio]:
        """Synthesize many requests together (continuous batching); yield each `Audio` as it finishes.

        `jobs` is read lazily, a few batches ahead of the engine, so it may be a long generator.
        Each job's request is checked as it is read, as `stream` checks one: a job that is not a
        `(Request, SamplingParams)` pair, or a field of the wrong type or range, raises RequestError
        naming the job and the field (`jobs[2]: max_seconds: must be > 0, got -1`).
        A request that fails (bad reference audio, unknown speaker, too long for the cache...) raises, named
        as the job it is (`jobs[1] (id 'b'): speaker: ...`); `stream` finishes the others first. `jobs` that is not an iterable (None, one pair alone) is a
        TypeError naming it.
        """
        return self._finished((numbered_job(i, job) for i, job in enumerate(requests_iterator("jobs", jobs))),
                              "jobs[{key}]")

    def generate_prepared(self, prepared: Iterable[tuple[Request, Prompt, SamplingParams]]) -> Iterator[Audio]:
        """`generate` for requests already turned into prompts (see `prepare`)."""
        return self._finished(Job(request, params, prompt=prompt) for request, prompt, params in prepared)

    def _finished(self, jobs: Iterable[Job], named: str | None = None) -> Iterator[Audio]:
        """The jobs' results; the first failure raised, named by `named` where given, formatted with the job's
        `key` (`generate`'s "jobs[{key}]", followed by the request's id where it has one) or with its id alone
        (`synthesize`'s "text[{id}]", whose ids are the positions)."""
        for outcome in Pipeline(self).run(jobs):
            if not outcome.ok:
                exc = outcome.exception or OmniTTSError(outcome.error)
                if named is None:
                    raise exc
                job = outcome.job
                where = named.format(key=job.key, id=job.request.id)
                if "{key}" in named and job.request.id is not None:
                    where += f" (id {job.request.id!r})"
                raise naming(exc, where, "text")
            yield outcome.result

    def run(self, request: Request, params: SamplingParams) -> Audio:
        """Synthesize one `Request` with explicit sampling parameters.

        Raises:
            RequestError: `request` is not a `Request`, `params` not `SamplingParams`, or a field of the
                request is of the wrong type or range, or does not fit the checkpoint (names the field).
        """
        check_job(request, params)
        return next(self._finished([Job(request, params)]))

    def run_reference(self, request: Request, params: SamplingParams) -> Audio:
        """The one-request eager slow path (what the engine is tested against), with greedy margins. Its
        arguments are checked as `run` checks them."""
        check_job(request, params)
        if params.samples and params.seed is None:  # drawn here, so the result says it (as the engine's do)
            params = replace(params, seed=fresh_seed())
        prompt = self.prepare(request)
        generation = generate_codes(self.ckpt, prompt, params.with_budget(prompt.text_tokens, request.max_seconds))
        audio = decode_codes(self.ckpt, generation.codes, prompt.ref_codes)
        return Audio(audio, self.sample_rate, generation.codes.numpy(), generation.finish_reason, request.id,
                     seed=params.seed, talker_margin=generation.talker_margin,
                     predictor_margin=generation.predictor_margin)

    def synthesize(self, text: str | list[str], *, language: str = "auto", speaker: str | None = None,
                   instruct: str | None = None, ref_audio=None, ref_text: str | None = None,
                   x_vector_only: bool = False, voice: Voice | str | Path | None = None,
                   non_streaming: bool | None = None, greedy: bool = False, max_frames: int | None = None,
                   max_seconds: float | None = None, seed: int | None = None, **sampling) -> Audio | list[Audio]:
        """Speak `text`: one string, or a list of strings batched together.

        Args:
            text: what to say; a list gives a list of results in the same order.
            language, speaker, instruct, ref_audio, ref_text, x_vector_only, voice, non_streaming:
                the `Request` fields (see `Request` for which ones each checkpoint kind takes).
                Reference audio is encoded once for a whole list.
            greedy: take the most likely code at every step (deterministic); otherwise codes are
                sampled with the checkpoint's defaults, overridable by keyword (`temperature`,
                `top_k`, `top_p`, `repetition_penalty`, `subtalker_*`).
            max_frames: frame budget per item (12.5 frames per second; a split item's pieces share it);
                None derives it from the text.
            max_seconds: the budget in seconds instead (a manifest line's `max_seconds`); one of the two.
            seed: makes sampling reproducible; with a list, item i uses `seed + i` (as a 64-bit integer: past
                2**63 - 1 it wraps to -2**63). Without one, each item's drawn seed is its `Audio.seed`.

        Returns:
            An `Audio` (samples, sample_rate, codes, ...; `.save(path)`; plays inline in Jupyter),
            or a list of them for a list of texts. Their ids are "0", "1", ...

        Raises:
            RequestError: a text or keyword that cannot be used, named (`speaker: ...`); with a list, an
                item that fails is named by its index (`text[3]: 71,400 characters make 350 pieces ...`).
            TypeError, ValueError: `text` that is not a string or a list of them (`text[1]: expected a string`),
                or `greedy`, `max_frames`, `seed` or a sampling keyword of the wrong type or range, named
                (`seed: expected an int, got float`), as `SamplingParams` checks them; `max_frames` and
                `max_seconds` together.
        """
        if not isinstance(text, (str, list, tuple)):
            raise TypeError(f"text: expected a string or a list of strings, got {type(text).__name__}")
        if max_frames is not None and max_seconds is not None:
            raise ValueError("max_frames, max_seconds: give one budget, not both")
        if "id" in sampling:  # a manifest field, not a sampling keyword
            raise TypeError("id: synthesize names its results by position ('0', '1', ...); give each item an id "
                            "in a dict to stream instead")
        check_seed(seed)
        seed = python_int(seed)  # item i's seed + i: a numpy int32's would wrap at 32 bits
        self.default_params(greedy, max_frames=max_frames, seed=seed, **sampling)  # each keyword, for [] too
        texts = [text] if isinstance(text, str) else list(text)
        for i, item in enumerate(texts):
            if not isinstance(item, str):
                raise TypeError(f"text[{i}]: expected a string, got {type(item).__name__}")
            where = "text" if isinstance(text, str) else f"text[{i}]"  # the item at fault, before the batch runs
            if problem := empty_text(item):
                raise RequestError(f"{where}: {problem}; give the words to speak")
            if problem := not_text(item):
                raise RequestError(f"{where}: {problem}")
        # The keywords; each text is checked above, named by its index. Against the checkpoint too, so that an
        # error of a keyword (an unknown speaker) is not taken for one of the first item's below.
        keywords = Request("", language, speaker, instruct, ref_audio, ref_text, x_vector_only, voice, non_streaming,
                           max_seconds=max_seconds)
        check_request(keywords)
        if texts:
            resolve(self.ckpt.config, replace(keywords, text=texts[0]))
        if texts and voice is not None:  # read and checked once: a voice of another checkpoint is not text[0]'s fault
            voice = self.usable_voice(voice)
        if ref_audio is not None and voice is None and len(texts) > 1:
            voice = self.clone_voice(ref_audio, ref_text, x_vector_only)
        jobs = []
        for i, item in enumerate(texts):
            request = Request(item, language, speaker, instruct, ref_audio, ref_text, x_vector_only, voice,
                              non_streaming, id=str(i), max_seconds=max_seconds)
            item_seed = None if seed is None else seed_word(seed + i)  # past 2**63 - 1: wrapped
            jobs.append(Job(request, self.default_params(greedy, max_frames=max_frames, seed=item_seed, **sampling)))
        # Not `generate`: every field is checked above, and a voice cloned once for the list sits beside the
        # ref_audio it came from (which `check_request` refuses in a request given whole).
        named = None if isinstance(text, str) else "text[{id}]"  # a list's item that fails is named by its index
        results = {result.id: result for result in self._finished(jobs, named)}
        ordered = [results[str(i)] for i in range(len(texts))]
        return ordered[0] if isinstance(text, str) else ordered

    def stream(self, requests: Iterable[StreamItem], *, greedy: bool = False, max_frames: int | None = None,
               seed: int | None = None, **sampling) -> Iterator[Audio]:
        """Synthesize many requests together and yield each `Audio` as soon as it is finished.

        Requests are read lazily, a few batches ahead of the engine (so `requests` may be a long
        generator), and decode with continuous batching, up to `max_batch` at a time.

        Args:
            requests: an iterable whose items are each
                - a `Request`;
                - a dict of manifest fields (`id`, `text`, `language`, `speaker`, `instruct`,
                  `ref_audio`, `ref_text`, `x_vector_only`, `non_streaming`, `seed`, `max_seconds`;
                  a relative `ref_audio` resolves against the current directory; read as a JSON manifest
                  line is: an integer `id` is its digits, a whole float such as 3.0 an integer; a NaN or pd.NA, a
                  DataFrame's empty cell, is absent: `df.to_dict("records")` gives a DataFrame's rows);
                - a `(Request or dict, SamplingParams)` pair, whose parameters are used as given (its dict
                  may not set `seed`, `temperature`, `top_k`, `top_p` or `repetition_penalty` too).
                An item without an id gets its position ("0", "1", ...); ids must be unique.
            greedy, max_frames, seed, **sampling: how items without their own `SamplingParams`
                sample, as in `synthesize`; item i uses `seed + i` unless its dict has a `seed`, and
                an item's own `max_seconds` is its budget instead of `max_frames`.

        Yields:
            `Audio` in the order the requests finish (not input order); match them up by `Audio.id`.

        Raises:
            RequestError: an item is malformed or does not fit the checkpoint (the message names it).
            Nothing already read is lost to it: from the first error on (a bad item, an item that fails
            while generating, or an exception from `requests` itself) no more requests are read, the ones
            already under way finish and are yielded, and then the first error is raised.
            TypeError, ValueError: `greedy`, `max_frames`, `seed` or a sampling keyword of the wrong type or
                range, named, as `synthesize` raises them (before any item is read); `requests` that is not
                an iterable of them (None, or one dict or Request given alone: `[request]` is a list of one).
        """
        check_seed(seed)
        seed = python_int(seed)  # item i's seed + i: a numpy int32's would wrap at 32 bits
        self.default_params(greedy, max_frames=max_frames, seed=seed, **sampling)  # each keyword, before any item
        source = requests_iterator("requests", requests)
        errors: list[BaseException] = []  # the first error; once there is one, no more requests are read

        def jobs():
            seen = set()
            try:
                i = 0
                while not errors:  # after an error, read nothing more
                    item = next(source, _END)
                    if item is _END:
                        return
                    request, params = stream_item(self, i, item, greedy, max_frames, seed, sampling)
                    if request.id in seen:
                        raise RequestError(f"requests[{i}]: id: {request.id!r} is used by an earlier request")
                    seen.add(request.id)
                    yield Job(request, params, key=i)
                    i += 1
            except Exception as exc:  # noqa: BLE001 - raised once the requests under way are yielded
                errors.append(exc)

        for outcome in Pipeline(self).run(jobs()):
            if outcome.ok:
                yield outcome.result
            elif not errors:
                exc = outcome.exception or OmniTTSError(outcome.error)
                errors.append(naming(exc, f"requests[{outcome.job.key}] (id {outcome.job.request.id!r})"))
        if errors:
            raise errors[0]
