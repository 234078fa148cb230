"""The synthesis pipeline: jobs in, finished audio out, with memory bounded by the running batch.

    for outcome in Pipeline(tts).run(jobs):  # jobs: any iterable of Job, read lazily
        outcome.result.save(...) if outcome.ok else print(outcome.error)

What it owns, between the caller's jobs and the engine:
- laziness: a job is prepared (text tokenized, reference audio encoded) only when the engine is
  within `lookahead` requests of needing it, so a 100,000-line manifest costs no more memory than
  a 100-line one;
- engine sizing: the engine is sized for the prompts in view; a later prompt that does not fit
  makes it drain and grow (rare: sizes round up and budgets derive from text length);
- long text: a job whose text is split (`split`, by default `text_split.split_text`) runs as
  several requests side by side in the batch, joined in order with crossfades (`join.join_pieces`)
  when the last piece finishes;
- audio: frames are decoded while generation continues, in chunks batched across requests
  (`CodecStreams`; `stream_decode=False` decodes each utterance whole when it ends instead);
- runaway retries: a sampled item that exhausted its derived frame budget is retried with a
  derived seed, up to `retry_runaway` times;
- stopping: once `stop()` returns true no new job starts; requests already running finish, the
  rest are dropped (a resumed run picks them up).
Outcomes come out in finishing order. The pipeline never prints.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from .engine import Engine, plan
from .errors import OmniTTSError
from .join import join_pieces
from .models.codec_streams import CodecStreams
from .params import SamplingParams, derive_seed
from .request import Request
from .text_split import split_text


@dataclass
class Job:
    """One item to synthesize: what to say, how to sample, and the caller's handle (`key`)."""

    request: Request
    params: SamplingParams
    key: object = None
    prompt: object = None  # an already built Prompt (then the text is not split)


@dataclass
class Outcome:
    """A finished job: `result` (an `Audio`) or an `error` message."""

    job: Job
    result: object = None
    error: str | None = None
    exception: Exception | None = None  # what raised `error`
    seed: int | None = None  # the seed actually used (assigned when the job had none and samples)
    attempts: int = 1  # 1 + runaway retries
    pieces: int = 1  # requests the text was split into
    timings: dict = field(default_factory=dict)  # seconds: prepare, generate, decode, total

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(eq=False)
class _Item:
    """A job in flight: its pieces' prompts, finished pieces and bookkeeping."""

    job: Job
    params: SamplingParams
    seed: int | None
    pieces: list = field(default_factory=list)  # (Request, Prompt) per piece
    done: dict = field(default_factory=dict)  # piece index -> (codes, audio, finish_reason)
    tries: dict = field(default_factory=dict)  # piece index -> runaway retries so far
    dropped: bool = False
    started: float = field(default_factory=time.perf_counter)
    prepare_s: float = 0.0
    decode_s: float = 0.0
    first_added: float | None = None


@dataclass
class _Decoding:
    """A sequence's codec stream: its id, the audio pumped so far, frames pushed so far."""

    sid: int
    pieces: list = field(default_factory=list)
    pushed: int = 0


_NOTHING = _Decoding(-1)


class Pipeline:
    """Runs jobs through one (re)sized engine; see the module docstring."""

    def __init__(self, tts, lookahead: int | None = None, retry_runaway: int = 0,
                 split: Callable[[str, str], list[str]] | None = None, join: Callable | None = None,
                 stop: Callable[[], bool] | None = None, stream_decode: bool = True):
        self.tts = tts
        self.lookahead = lookahead or max(2 * tts.max_batch, 8)
        self.retry_runaway = retry_runaway
        self.split = split or (lambda text, language: split_text(text, language=language))
        self.join = join or join_pieces
        self.stop = stop or (lambda: False)
        self.engine: Engine | None = None
        self.engines_built = 0
        self.streams = CodecStreams(tts.ckpt.codec, tts.codec_chunk_frames, tts.max_batch) if stream_decode else None
        self.decoding: dict = {}  # engine Sequence -> its _Decoding (codec stream)

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, jobs: Iterable[Job]) -> Iterator[Outcome]:
        source = iter(jobs)
        ready: deque = deque()  # (item, piece index, params) prepared but not yet in the engine
        exhausted = stopped = False
        while True:
            if not stopped and self.stop():
                stopped = exhausted = True
                self._drop(ready)
            if not exhausted:
                failures, exhausted = self._fill(source, ready)
                yield from failures
            self._feed(ready, exhausted)
            engine = self.engine
            if engine is None or not engine.has_work():
                if exhausted and not ready:
                    return
                continue
            finished = engine.step()
            self._stream(engine, finished)
            for seq in finished:
                outcome = self._finished(seq, ready)
                if outcome is not None:
                    yield outcome

    def _fill(self, source, ready: deque) -> tuple[list[Outcome], bool]:
        """Prepare jobs until `lookahead` requests wait; returns (failed outcomes, source exhausted)."""
        failures = []
        waiting = len(self.engine.scheduler.waiting) if self.engine is not None else 0
        while len(ready) + waiting < self.lookahead:
            job = next(source, None)
            if job is None:
                return failures, True
            item, error = self._prepare(job)
            if error is not None:
                failures.append(error)
                continue
            ready.extend((item, index, self._piece_params(item, index)) for index in range(len(item.pieces)))
        return failures, False

    def _prepare(self, job: Job) -> tuple[_Item | None, Outcome | None]:
        started = time.perf_counter()
        params = job.params
        seed = params.seed
        if seed is None and params.samples:
            seed = random.SystemRandom().randrange(2**31)  # recorded, so every result can be reproduced
        item = _Item(job, replace(params, seed=seed), seed, started=started)
        request = job.request
        try:
            if job.prompt is not None:
                item.pieces.append((request, job.prompt))
                return item, None
            texts = self.split(request.text, request.language) or [request.text]  # empty: prepare says why
            if len(texts) > 1 and request.ref_audio is not None and request.voice is None:
                voice = self.tts.clone_voice(request.ref_audio, request.ref_text, request.x_vector_only)
                request = replace(request, voice=voice)  # encode the reference once for all pieces
            for index, text in enumerate(texts):
                piece = request if len(texts) == 1 else replace(request, text=text)
                item.pieces.append((piece, self.tts.prepare(piece)))
            for index in range(len(item.pieces)):
                self._check_fits_alone(item, index)
        except OmniTTSError as exc:
            return None, Outcome(job, error=str(exc), exception=exc, seed=seed,
                                 timings={"total": _since(started)})
        item.prepare_s = _since(started)
        return item, None

    def _check_fits_alone(self, item: _Item, index: int) -> None:
        """Raise RequestError if this piece would not fit an engine even on its own (cache budget)."""
        prompt, params = item.pieces[index][1], self._piece_params(item, index)
        tts = self.tts
        plan(tts.ckpt, prompt.embeds.shape[0] + params.max_frames + 1, 1, prompt.trailing.shape[0],
             tts.kv_budget_bytes, tts.ckpt.device.type, tts.eager, tts.graph_buckets)

    def _piece_params(self, item: _Item, index: int) -> SamplingParams:
        """Piece 0 keeps the item's seed; later pieces and runaway retries derive theirs from it.

        A retry reruns only the piece that ran away, so the pieces of one item stay independent.
        """
        seed = derive_seed(item.seed, "piece", index)
        retries = item.tries.get(index, 0)
        if seed is not None and retries:
            seed = derive_seed(seed, "retry", retries)
        request, prompt = item.pieces[index]
        return replace(item.params, seed=seed).with_budget(prompt.text_tokens, request.max_seconds)

    def _feed(self, ready: deque, exhausted: bool) -> None:
        """Move prepared requests into the engine, (re)building it when one does not fit."""
        while ready:
            item, index, params = ready[0]
            if self.engine is None or not self._fits(item, index, params):
                if self.engine is not None and self.engine.has_work():
                    return  # drain the current engine first; it grows afterwards
                self.engine = self._build(ready, exhausted)
            ready.popleft()
            if item.dropped:
                continue
            item.first_added = item.first_added or time.perf_counter()
            self.engine.add(item.pieces[index][1], params, tag=(item, index))

    def _fits(self, item: _Item, index: int, params: SamplingParams) -> bool:
        prompt, config = item.pieces[index][1], self.engine.config
        return (prompt.embeds.shape[0] + params.max_frames + 1 <= config.max_positions
                and prompt.trailing.shape[0] <= config.max_text_tokens)

    def _build(self, ready: deque, exhausted: bool) -> Engine:
        tts = self.tts
        prompts = [(item.pieces[index][1], params) for item, index, params in ready]
        positions = max(p.embeds.shape[0] + params.max_frames + 1 for p, params in prompts)
        text = max(p.trailing.shape[0] for p, _ in prompts)
        slots = min(tts.max_batch, len(prompts)) if exhausted else tts.max_batch
        config = plan(tts.ckpt, positions, slots, text, tts.kv_budget_bytes, tts.ckpt.device.type, tts.eager,
                      tts.graph_buckets)
        self.engine = None  # free the old engine's cache before allocating the new one
        self.engines_built += 1
        return Engine(tts.ckpt, config)

    def _drop(self, ready: deque) -> None:
        """Stop: forget everything not yet running; items with a dropped piece never complete."""
        for item, _, _ in ready:
            item.dropped = True
        ready.clear()
        if self.engine is not None:
            for seq in self.engine.drop_waiting():
                seq.tag[0].dropped = True

    # -- finishing --------------------------------------------------------------------------------
    def _finished(self, seq, ready: deque) -> Outcome | None:
        item, index = seq.tag
        if item.dropped:
            if self.streams is not None and seq in self.decoding:
                self.streams.close(self.decoding.pop(seq).sid)
            return None
        auto_budget = item.job.params.max_frames is None and item.job.request.max_seconds is None
        if (seq.finish_reason == "length" and auto_budget and item.params.samples
                and item.tries.get(index, 0) < self.retry_runaway):
            item.tries[index] = item.tries.get(index, 0) + 1
            if self.streams is not None and seq in self.decoding:
                self.streams.close(self.decoding.pop(seq).sid)  # the abandoned attempt's audio
            ready.appendleft((item, index, self._piece_params(item, index)))
            return None
        started = time.perf_counter()
        codes = seq.codes()
        audio = self._decode(seq, codes)
        item.decode_s += _since(started)
        item.done[index] = (codes, audio, seq.finish_reason)
        if len(item.done) < len(item.pieces):
            return None
        return self._complete(item)

    def _stream(self, engine: Engine, finished: list) -> None:
        """Feed every sequence's new frames to its codec stream; decode what is ready, batched."""
        if self.streams is None:
            return
        seqs = list(engine.scheduler.running) + finished
        for seq in seqs:
            if len(seq.frames) == self.decoding.get(seq, _NOTHING).pushed:
                continue
            if seq not in self.decoding:
                self.decoding[seq] = _Decoding(self.streams.open(seq.prompt.ref_codes))
            state = self.decoding[seq]
            self.streams.push(state.sid, np.stack(seq.frames[state.pushed:]))
            state.pushed = len(seq.frames)
        for seq in finished:
            if seq in self.decoding:
                self.streams.finish(self.decoding[seq].sid)
        started = time.perf_counter()
        decoded = self.streams.pump()
        if not decoded:
            return
        share = _since(started) / len(decoded)
        for seq in seqs:
            state = self.decoding.get(seq)
            if state is not None and state.sid in decoded:
                state.pieces.append(decoded[state.sid])
                seq.tag[0].decode_s += share

    def _decode(self, seq, codes: np.ndarray) -> np.ndarray:
        """The finished sequence's audio: the rest of its stream, or a whole-utterance decode."""
        if self.streams is None:
            from .reference import decode_codes

            return decode_codes(self.tts.ckpt, torch.from_numpy(codes), seq.prompt.ref_codes)
        if seq not in self.decoding:  # EOS before the first frame
            return np.zeros(0, dtype=np.float32)
        state = self.decoding.pop(seq)
        end = self.streams.close(state.sid)
        return np.concatenate([end.head, *state.pieces, end.tail]).astype(np.float32)

    def _complete(self, item: _Item) -> Outcome:
        from .result import Audio

        parts = [item.done[i] for i in range(len(item.pieces))]
        rate = self.tts.sample_rate
        audio = parts[0][1] if len(parts) == 1 else self.join([p[1] for p in parts], rate)
        codes = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        reason = "length" if any(p[2] == "length" for p in parts) else "eos"
        result = Audio(audio, rate, codes, reason, item.job.request.id, seed=item.seed)
        now = time.perf_counter()
        timings = {"prepare": item.prepare_s, "generate": now - (item.first_added or now) - item.decode_s,
                   "decode": item.decode_s, "total": now - item.started}
        attempts = 1 + max(item.tries.values(), default=0)
        return Outcome(item.job, result, seed=item.seed, attempts=attempts, pieces=len(item.pieces),
                       timings={k: round(v, 4) for k, v in timings.items()})


def _since(start: float) -> float:
    return time.perf_counter() - start
