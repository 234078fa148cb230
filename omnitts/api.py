"""The Python API: load a checkpoint, clone voices, synthesize.

    import omnitts
    tts = omnitts.load("Qwen3-TTS-12Hz-0.6B-CustomVoice")
    audio = tts.synthesize("Hello there.", speaker="ryan", language="english")
    audio.save("hello.wav")          # or show `audio` in Jupyter to play it
    for audio in tts.stream([{"id": "a", "text": "One.", "speaker": "ryan"}, ...]):
        ...                          # each `Audio` as soon as it is finished

Requests run through the continuous-batching engine (`stream` and `generate` take many at once and
yield results as they finish); `run_reference` keeps the one-request slow path that the engine is
tested against. The library never prints.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Iterator, Union

import numpy as np
import torch

from .checkpoint import Checkpoint, load_checkpoint
from .device import make_deterministic, out_of_memory
from .engine import EngineConfig
from .engine.pipeline import Job, Pipeline
from .engine.reference import decode_codes, generate_codes
from .errors import AudioError, OmniTTSError, RequestError, VoiceError, type_label
from .info import checkpoint_info
from .io import user_path
from .io.audio import load_reference
from .params import SamplingParams, check_flag, check_seed, fresh_seed
from .recipe import VISIBLE, device_index, option_problem, type_name
from .request import Request, Voice
from .sampling import seed_word
from .result import Audio, Result  # noqa: F401  (Result: the old name of Audio)
from .text import empty_text, no_transcript
from .text.prompt import Prompt, PromptBuilder, not_text, resolve
from .voice import check_fits, check_voice, checkpoint_identity, load_voice

_END = object()  # the end of `stream`'s requests
KV_BUDGET_BYTES = 4 * 2**30  # default talker-cache budget of one generate() call


# What `TTS.stream` accepts per item: a Request, a manifest-style dict, or either with its own parameters.
StreamItem = Union[Request, dict, tuple[Union[Request, dict], SamplingParams]]


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
        _check_deterministic(deterministic, graph_buckets)
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
        _check_reference(ref_audio)
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
        if isinstance(voice, (str, Path)):
            voice = self.load_voice(voice)
        elif voice is not None and voice.checkpoint is not None and voice.checkpoint != self.identity:
            raise VoiceError(f"voice: made with checkpoint {voice.checkpoint}, not with {self.ckpt.path} "
                             f"({self.identity}); clone it again with this checkpoint")
        if isinstance(request.voice, Voice):
            check_fits(voice, self.ckpt.config, "voice")
            if voice.icl and voice.ref_codes.dtype != torch.long:  # int16 codes (a compact array) index no embedding
                voice = replace(voice, ref_codes=voice.ref_codes.long())
        elif voice is None and request.ref_audio is not None:
            voice = self.clone_voice(request.ref_audio, request.ref_text, request.x_vector_only)
        return self.prompts.build(request, voice)

    def generate(self, jobs: Iterable[tuple[Request, SamplingParams]]) -> Iterator[Audio]:
        """Synthesize many requests together (continuous batching); yield each `Audio` as it finishes.

        `jobs` is read lazily, a few batches ahead of the engine, so it may be a long generator.
        Each job's request is checked as it is read, as `stream` checks one: a job that is not a
        `(Request, SamplingParams)` pair, or a field of the wrong type or range, raises RequestError
        naming the job and the field (`jobs[2]: max_seconds: must be > 0, got -1`).
        A request that fails (bad reference audio, unknown speaker, too long for the cache...) raises;
        `stream` finishes the others first. `jobs` that is not an iterable (None, one pair alone) is a
        TypeError naming it.
        """
        return self._finished(_numbered_job(i, job) for i, job in enumerate(_requests_iterator("jobs", jobs)))

    def generate_prepared(self, prepared: Iterable[tuple[Request, Prompt, SamplingParams]]) -> Iterator[Audio]:
        """`generate` for requests already turned into prompts (see `prepare`)."""
        return self._finished(Job(request, params, prompt=prompt) for request, prompt, params in prepared)

    def _finished(self, jobs: Iterable[Job], named: str | None = None) -> Iterator[Audio]:
        """The jobs' results; the first failure raised, named by `named` with the job's id where given
        (`synthesize`'s "text[{}]")."""
        for outcome in Pipeline(self).run(jobs):
            if not outcome.ok:
                exc = outcome.exception or OmniTTSError(outcome.error)
                raise exc if named is None else _naming(exc, named.format(outcome.job.request.id), "text")
            yield outcome.result

    def run(self, request: Request, params: SamplingParams) -> Audio:
        """Synthesize one `Request` with explicit sampling parameters.

        Raises:
            RequestError: `request` is not a `Request`, `params` not `SamplingParams`, or a field of the
                request is of the wrong type or range, or does not fit the checkpoint (names the field).
        """
        _check_job(request, params)
        return next(self._finished([Job(request, params)]))

    def run_reference(self, request: Request, params: SamplingParams) -> Audio:
        """The one-request eager slow path (what the engine is tested against), with greedy margins. Its
        arguments are checked as `run` checks them."""
        _check_job(request, params)
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
        seed = _python_int(seed)  # item i's seed + i: a numpy int32's would wrap at 32 bits
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
        _check_request(keywords)
        if texts:
            resolve(self.ckpt.config, replace(keywords, text=texts[0]))
        if ref_audio is not None and voice is None and len(texts) > 1:
            voice = self.clone_voice(ref_audio, ref_text, x_vector_only)
        jobs = []
        for i, item in enumerate(texts):
            request = Request(item, language, speaker, instruct, ref_audio, ref_text, x_vector_only, voice,
                              non_streaming, id=str(i), max_seconds=max_seconds)
            item_seed = None if seed is None else seed_word(seed + i)  # past 2**63 - 1: wrapped
            jobs.append(Job(request, self.default_params(greedy, max_frames=max_frames, seed=item_seed, **sampling)))
        # Not `generate`: every field is checked above, and a voice cloned once for the list sits beside the
        # ref_audio it came from (which `_check_request` refuses in a request given whole).
        named = None if isinstance(text, str) else "text[{}]"  # a list's item that fails is named by its index
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
        seed = _python_int(seed)  # item i's seed + i: a numpy int32's would wrap at 32 bits
        self.default_params(greedy, max_frames=max_frames, seed=seed, **sampling)  # each keyword, before any item
        source = _requests_iterator("requests", requests)
        errors: list[BaseException] = []  # the first error; once there is one, no more requests are read

        def jobs():
            seen = set()
            try:
                i = 0
                while not errors:  # after an error, read nothing more
                    item = next(source, _END)
                    if item is _END:
                        return
                    request, params = self._stream_item(i, item, greedy, max_frames, seed, sampling)
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
                errors.append(_naming(exc, f"requests[{outcome.job.key}] (id {outcome.job.request.id!r})"))
        if errors:
            raise errors[0]

    def _stream_item(self, i: int, item, greedy, max_frames, seed, sampling) -> tuple[Request, SamplingParams]:
        """One `stream` item -> (Request with an id, SamplingParams)."""
        from .batch.manifest import _typed_values, parse_item

        params = None
        if isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], SamplingParams):
                raise RequestError(f"requests[{i}]: a pair must be (Request or dict, SamplingParams)")
            item, params = item
        item_seed = None if seed is None else seed_word(seed + i)  # past 2**63 - 1: wrapped
        if isinstance(item, dict):
            # Read as a manifest line is: numpy's numbers (a seed from np.arange) as Python's, as the keyword
            # arguments take them; NaN or pandas' NA, a DataFrame row's empty cell (df.to_dict("records")), absent, as
            # the null of a table manifest made from that DataFrame; an integer id its digits, a whole float an
            # integer. Only a missing id is the position (the id 0 was taken for none)
            item = {k: v.item() if isinstance(v, (np.integer, np.floating)) else v for k, v in item.items()}
            item = _typed_values({k: v for k, v in item.items() if not _empty_cell(v)})
            if item.get("id") is None or (isinstance(item["id"], str) and not item["id"]):  # (an array's == is one)
                item = {**item, "id": str(i)}
            for name in ("ref_audio", "voice"):  # a manifest line names files; objects go in a Request
                if item.get(name) is not None and not isinstance(item[name], (str, os.PathLike)):
                    raise RequestError(f"requests[{i}]: {name}: a dict takes a file's path, as a manifest line "
                                       f"does, got {type(item[name]).__name__}; give a Request(..., {name}=...) "
                                       "for samples or a Voice")
                if isinstance(item.get(name), os.PathLike):  # a Path is a path: the manifest check takes a string
                    item = {**item, name: os.fspath(item[name])}
            try:
                parsed = parse_item(item, i + 1, Path.cwd())
            except RequestError as exc:
                raise RequestError(f"requests[{i}]: {exc}") from None
            given = ["seed"] * (parsed.seed is not None) + list(parsed.sampling)
            if params is not None and given:  # the pair's parameters are used as given: this field would be dropped
                raise RequestError(f"requests[{i}]: {given[0]}: the pair's SamplingParams decide how it samples; set "
                                   f"{given[0]} there, or give the dict alone")
            request, item_seed = parsed.request, parsed.seed if parsed.seed is not None else item_seed
            sampling = {**sampling, **parsed.sampling}
            if parsed.voice_path is not None:
                request = replace(request, voice=parsed.voice_path)
        elif isinstance(item, Request):
            try:
                _check_request(item)
            except RequestError as exc:
                raise RequestError(f"requests[{i}]: {exc}") from None
            request = item if item.id else replace(item, id=str(i))  # "" is no id, as a dict's
        else:
            raise RequestError(f"requests[{i}]: expected a Request, a dict or a (request, SamplingParams) pair, "
                               f"got {type(item).__name__}")
        if params is None:  # an item's own max_seconds beats the run-wide max_frames (as in `omnitts synth`)
            budget = None if request.max_seconds is not None else max_frames
            params = self.default_params(greedy, max_frames=budget, seed=item_seed, **sampling)
        return request, params


def _requests_iterator(name: str, value) -> Iterator:
    """An iterator over `value`, the requests of `stream` or `generate`: one request given alone (a dict, a
    Request; a string) would be iterated over its keys or characters, and None said only "'NoneType' object is
    not iterable"; TypeError naming the argument."""
    if hasattr(value, "columns") and hasattr(value, "to_dict"):  # a DataFrame iterates over its column names
        raise TypeError(f"{name}: a {type_label(type(value))} iterates over its column names; give its rows: "
                        "df.to_dict('records')")
    if isinstance(value, (str, bytes, dict, Request)):
        one = "[request]" if name == "requests" else "[(request, params)]"
        raise TypeError(f"{name}: expected an iterable of requests (a list, a generator), got one "
                        f"{type_label(type(value))}; give one request in a list: {one}")
    try:
        return iter(value)
    except TypeError:
        raise TypeError(f"{name}: expected an iterable of requests (a list, a generator), got "
                        f"{type_label(type(value))}") from None


def _empty_cell(value) -> bool:
    """A DataFrame's empty cell: NaN (a float or object column's), or pandas' NA or NaT (a nullable column's,
    `df.convert_dtypes()`; pandas 2's `to_dict` gives them as they are), told by type, without importing pandas."""
    if isinstance(value, float) and math.isnan(value):
        return True
    kind = type(value)
    return kind.__name__ in ("NAType", "NaTType") and kind.__module__.startswith("pandas")


def _python_int(value):
    """A checked integer (numpy's too) as a Python int, whose arithmetic never wraps; None stays None."""
    return None if value is None else int(value)


def _check_request(request: Request) -> None:
    """Check a request's fields as a manifest line's are checked (type, range, text; `batch.manifest`), and
    that it names one reference, before anything uses them: RequestError naming the field."""
    from .batch.manifest import check_fields

    if request.text is None:  # required: `check_fields` takes None for absent, as in a manifest's optional fields
        raise RequestError("text: missing; give the words to speak")
    check_fields({name: getattr(request, name) for name in ("id", "text", "language", "speaker", "instruct",
                                                            "ref_text", "x_vector_only", "non_streaming",
                                                            "max_seconds")})
    if request.ref_audio is not None:
        _check_reference(request.ref_audio)
    if request.voice is not None and not isinstance(request.voice, (Voice, str, os.PathLike)):
        raise RequestError(f"voice: expected a Voice or the path of a voice file, got {type(request.voice).__name__}")
    if request.ref_audio is not None and request.voice is not None:  # one of them would be ignored
        raise RequestError("voice: give either ref_audio or voice, not both")


def _check_job(request, params) -> None:
    """A request and its parameters as `run` and `generate` take them: of those types, the request's fields
    checked as `stream` checks a `Request` (`_check_request`). RequestError naming the argument or field."""
    if not isinstance(request, Request):
        raise RequestError(f"request: expected a Request, got {type(request).__name__}")
    if not isinstance(params, SamplingParams):
        raise RequestError(f"params: expected SamplingParams (see TTS.default_params), got {type(params).__name__}")
    _check_request(request)


def _numbered_job(i: int, job) -> Job:
    """`generate`'s job `i`, a (Request, SamplingParams) pair, checked (`_check_job`): errors name `jobs[i]`."""
    if not isinstance(job, (tuple, list)) or len(job) != 2:
        raise RequestError(f"jobs[{i}]: expected a (Request, SamplingParams) pair, got {type(job).__name__}")
    try:
        _check_job(*job)
    except RequestError as exc:
        raise RequestError(f"jobs[{i}]: {exc}") from None
    return Job(*job)


def _check_reference(ref_audio) -> None:
    """Reference audio is a path or a (samples, sample_rate) pair (`io.audio.load_reference` checks the pair)."""
    if not isinstance(ref_audio, (str, os.PathLike, tuple)):
        raise RequestError(f"ref_audio: expected a path or a (samples, sample_rate) pair, got "
                           f"{type(ref_audio).__name__}")


def _naming(exc: BaseException, where: str, field: str | None = None) -> BaseException:
    """`exc` with `where` before its message: of its own type, chained to it (as `raise ... from exc`); `exc`
    itself with `where` as a note where its type is not made from a message alone. `field`: a field that
    `where` names already, dropped from the message's start (`text[3]: ...`, not `text[3]: text: ...`)."""
    message = str(exc)
    if field is not None:
        message = message.removeprefix(f"{field}: ")
    try:
        named = type(exc)(f"{where}: {message}")
    except Exception:  # noqa: BLE001 - a constructor that takes other arguments (UnicodeDecodeError takes five)
        if hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(where)
        return exc
    named.__cause__ = exc
    return named


def _check_deterministic(deterministic: bool, graph_buckets) -> None:
    """Deterministic mode runs every frame at the full batch (`EngineConfig.full_batch`): batch sizes given
    as well contradict it."""
    if deterministic and graph_buckets is not None:
        raise OmniTTSError("deterministic: every frame runs at the full batch, so graph_buckets do not apply; "
                           "leave them out")


def load(path, device: str = "cpu", dtype: str = "auto", official_tokenizer: bool = False,
         max_batch: int = 8, eager: bool = False, graph_buckets: list[int] | None = None,
         codec_chunk_frames: int = 25, span_buckets: list[int] | None = None,
         max_prefill_tokens: int | None = EngineConfig.max_prefill_tokens, codec_dtype: str = "float32",
         deterministic: bool = False) -> TTS:
    """Load a Qwen3-TTS-12Hz checkpoint directory (CustomVoice, VoiceDesign or Base; 0.6B or 1.7B).

    Args:
        path: the checkpoint directory, exactly as published (a str or path; `~` is the home folder).
        device: cpu, cuda or npu, or a torch.device of them (npu imports torch_npu; set allocator variables
            before calling); cuda and npu run on the process's current device (`torch.cuda.set_device`).
        dtype: auto (default: bfloat16 on cuda, on A2-class NPUs (float16 on older ones) and on CPUs
            with native bf16, AVX512-BF16 or AMX; float32 elsewhere), float32, bfloat16 or float16 for
            the language models, by name or as the torch dtype (torch.bfloat16). Parity
            with the official package is judged in float32.
        official_tokenizer: reproduce the official package's token ids (see tokenizer.py).
        max_batch: how many requests decode together at most.
        eager: no graph capture on cuda/npu (also OMNITTS_EAGER=1).
        graph_buckets: batch sizes that get a captured graph (None: 1, 2, 4, ... up to max_batch).
        span_buckets: attention spans that get a graph per batch size (None: 256, 512, ...; the
            engine's max_positions always does): a frame attends over the smallest that fits.
        max_prefill_tokens: prompt positions admitted per engine step at most (None: no limit).
        codec_chunk_frames: frames per streamed codec decode call (audio is decoded while
            generation continues, batched across requests).
        codec_dtype: float32 (default) or bfloat16 for the codec decoder (a name or the torch dtype). bfloat16 is what the
            official package does in bfloat16; it costs audio quality (about 20 dB SNR against
            float32) and on the CPU is no faster than the float32 codec of a bfloat16 run
            (docs/performance.md).
        deterministic: a line's codes and samples do not depend on the lines decoded beside it (their
            number, lengths, order), so shards, workers, retries and re-runs with the same settings give the
            same audio; costs some speed (docs/determinism.md). On the cpu the codes never depend on them,
            and this makes the samples bitwise too (the codec decodes one stream per call); npu: OmniTTSError.

    Returns:
        A `TTS` ready to `synthesize`, `stream` and describe itself with `info`.

    Raises:
        CheckpointError: a file is missing or does not match (the message names it).
        TypeError, ValueError: an engine option (dtype, max_batch, graph_buckets, ...) of the wrong type or range,
            named, before anything loads; the rule a recipe's keys follow. `path` and `official_tokenizer`
            are type-checked alike.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected the checkpoint directory (a string or path), got {type(path).__name__}")
    if not isinstance(official_tokenizer, bool):  # not a recipe key, but a flag like eager
        raise TypeError(f"official_tokenizer: expected true or false, got {type_name(type(official_tokenizer), True)}")
    # torch.bfloat16 -> "bfloat16" (as a torch.device is taken as its name below), then checked as that name is
    dtype, codec_dtype = (str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v for v in (dtype, codec_dtype))
    for name, value in (("dtype", dtype), ("codec_dtype", codec_dtype), ("max_batch", max_batch), ("eager", eager),
                        ("deterministic", deterministic),
                        ("graph_buckets", graph_buckets), ("span_buckets", span_buckets),
                        ("max_prefill_tokens", max_prefill_tokens), ("codec_chunk_frames", codec_chunk_frames)):
        if problem := option_problem(name, value):
            kind, message = problem
            raise kind(f"{name}: {message}")
    _check_deterministic(deterministic, graph_buckets)  # before the checkpoint loads, as `TTS` would after
    if isinstance(device, torch.device):  # torch.device("cuda", 1) -> "cuda:1", checked as that name is
        device = str(device)
    if deterministic:
        if device == "npu":
            raise OmniTTSError("deterministic: not available on npu (cuda has it; the cpu is always deterministic)")
        if device == "cuda":  # cuBLAS's reproducibility setting, read when its first handle is made
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if device == "npu":
        from .device.npu import import_torch_npu

        import_torch_npu()  # before any tensor goes to the NPU
    elif device == "cuda" and not torch.cuda.is_available():
        raise OmniTTSError("device 'cuda': no CUDA device is visible to torch (load with device='cpu')")
    elif device not in ("cpu", "cuda"):
        if one := device_index(device):  # "cuda" means the current device: one per process
            kind, index = one
            raise OmniTTSError(f"device {device!r}: give the kind, {kind!r}, which runs on the process's current "
                               f"device: choose it first (torch.{kind}.set_device({index}) before loading, or "
                               f"{VISIBLE[kind]}={index} before Python starts; on the command line: --devices {device})")
        raise OmniTTSError(f"device {device!r}: choose cpu, cuda or npu")
    try:
        ckpt = load_checkpoint(path, device=device, dtype=dtype, official_tokenizer=official_tokenizer,
                               max_batch=max_batch, codec_dtype=codec_dtype)
    except Exception as exc:
        if not out_of_memory(exc):
            raise
        smaller = " choose a smaller --dtype (bfloat16)," if dtype == "float32" else ""
        said = " ".join(str(exc).split()) or type(exc).__name__
        raise OmniTTSError(f"{path}: the model does not fit in {device} memory while loading ({said});{smaller} "
                           "free memory or use a device with more") from None
    if deterministic:
        make_deterministic(ckpt.model.talker, ckpt.device)
    return TTS(ckpt, max_batch=max_batch, eager=eager, graph_buckets=graph_buckets,
               codec_chunk_frames=codec_chunk_frames, span_buckets=span_buckets,
               max_prefill_tokens=max_prefill_tokens, deterministic=deterministic)
