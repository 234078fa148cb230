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
  several requests side by side in the batch, joined in order with crossfades (`join.StreamJoiner`,
  equal to `join.join_pieces`). What one job may cost is bounded before it runs: at most
  `split.MAX_PIECES` pieces (their prompts are held until the job ends), and an explicit frame
  budget (`max_frames`, a line's `max_seconds`) is the whole job's, shared by its pieces in
  proportion to their text tokens (`params.share_frames`); the derived runaway budget is per piece;
- audio: frames are decoded while generation continues, in chunks batched across requests
  (`decoding.AudioStreams` over `CodecStreams`; `stream_decode=False` decodes each utterance whole when it ends instead); a step's
  decoded audio is read from the device at the next step, once that step's frame is queued, so the
  host never waits for the codec while the device could run a frame (a finished item's last audio is
  read when it finishes); and
  with a `sink` (the CLI's: a temporary file per item) the joined audio leaves as soon as it is
  final, so memory does not grow with the audio length. Audio is held back only where it may still
  change: a piece after one still running, the last crossfade of a piece, an in-context clone's
  stream (the reference cut is known only at its end), an attempt a runaway retry may discard;
- runaway retries: a sampled item that exhausted its derived frame budget is retried with a
  derived seed, up to `retry_runaway` times;
- order: requests start in job order until the jobs run out; the last ones start longest budget
  first (`Scheduler.longest_first`), which keeps the batch full to the end;
- stopping: once `stop()` returns true no new job starts; requests already running finish, the
  rest are dropped (a resumed run picks them up);
- faults: an exception while preparing, generating or decoding fails the item at fault, never the
  run. One from `engine.step()` cannot be pinned on a row: the engine, whose state may be broken, is
  dropped, the requests that had not started go on in a new one, and the items whose requests had
  started are tried again from their start ("suspects"), one at a time beside the other items, so that
  the item at fault fails alone (error "ExceptionType while generating: ...") and the others finish as
  in a clean run (`_engine_failed`). One from the codec fails the item whose stream raised ("... while
  decoding: ..."; a batched codec call that raises is retried row by row, see `CodecStreams`). A failed
  item's other pieces are forgotten or, if already running, finish unseen. Errors writing audio (a
  sink's OSError) are not the item's fault: they end the run;
- a broken device: after each fault on the device the backend is asked whether the device still
  computes (`Backend.broken`: a sticky CUDA or NPU error fails every later call), and
  `DEVICE_FAILURES` engines failing in a row with no good step between them mean the same: then the
  run ends with `DeviceFailed`, and the items in flight are left for a re-run, not recorded as failed.
Outcomes come out in finishing order. The pipeline never prints.
"""

from __future__ import annotations

import random
import time
import warnings
from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from ..device import get_backend, out_of_memory
from ..device.copies import uploader
from ..errors import DeviceFailed, OmniTTSError, RequestError
from ..models.codec_streams import CodecStreams
from ..params import SamplingParams
from ..text.split import pieces_problem, split_text
from .decoding import AudioStreams, finite
from .engine import Engine, plan
from .jobs import Job, JobState, Outcome
from .join import StreamJoiner

__all__ = ["Job", "Outcome", "Pipeline"]


_END = object()  # a jobs source that has nothing more
# Engines failing in a row, with no good step between them, that mean a broken device. A suspect's trial
# starts only once an engine has run a good step since the last failure (`_next_trial`), so items at
# fault make engines fail in a row only where a fresh engine's first step holds a new one.
DEVICE_FAILURES = 3
MAX_INVOLVED = 3  # engine failures one item may share before it is failed without its own trial
IDLE_WAIT = 0.05  # seconds an idle pipeline waits before asking a "nothing now" source again


class Pipeline:
    """Runs jobs through one (re)sized engine; see the module docstring."""

    def __init__(self, tts, lookahead: int | None = None, retry_runaway: int = 0,
                 split: Callable[[str, str], list[str]] | None = None, stop: Callable[[], bool] | None = None,
                 stream_decode: bool = True, sink: Callable[[Job], object] | None = None,
                 started: Callable[[Job], None] | None = None):
        self.tts = tts
        self.started = started or (lambda job: None)  # told before an item's first request is admitted
        self.lookahead = lookahead or max(2 * tts.max_batch, 8)
        self.retry_runaway = retry_runaway
        self.split = split or (lambda text, language: split_text(text, language=language))
        self.sink = sink
        self.stop = stop or (lambda: False)
        self.engine: Engine | None = None
        self.engines_built = 0
        # What graph capture cost the engines this run dropped (`Engine.graph_stats`, added up).
        self._graphs_before = Counter(captures=0, warmup_frames=0, capture_seconds=0.0, prefill_captures=0,
                                      prefill_capture_seconds=0.0)
        self.backend = backend = get_backend(tts.ckpt.device.type, eager=tts.eager)
        fixed = backend.codec_fixed_shapes
        # Deterministic mode: one stream per codec call (its shape, so its convolutions' algorithms and
        # rounding, never depend on other streams; on accelerators behind the frames, on their stream); on a
        # device with graphs every frame at the full batch too (`_build`; the CPU's frames are
        # batch-invariant as they are).
        alone = tts.deterministic
        self.full_batch = alone and backend.supports_graphs
        self.warned_small = False  # a deterministic run warned that an engine had fewer rows than max_batch
        with _fitting(tts, "the codec's state for that many streams"):
            streams = (CodecStreams(tts.ckpt.codec, tts.codec_chunk_frames, tts.max_batch,
                                         tile_frames=backend.codec_tile_frames, upload=uploader(tts.ckpt.device),
                                         to_host=backend.to_host, gather=0 if alone else backend.codec_gather,
                                         fixed=fixed, max_rows=1 if alone else None,
                                         graphs=backend.call_graphs("codec", False if alone else None) if fixed
                                         else None, free_memory=backend.free_memory())
                       if stream_decode else None)
        # The running sequences' codec streams (None: each utterance is decoded whole when it ends).
        self.audio = AudioStreams(streams, self._decode_failed) if streams is not None else None
        self.starved = False  # the jobs source last said "nothing now" (None)
        self.in_engine: set = set()  # sequences added to the engine and not yet returned finished
        self.failures: deque = deque()  # outcomes of items that failed while running, not yet yielded
        self.suspects: deque = deque()  # items waiting for their trial (see `_engine_failed`)
        self.on_trial: JobState | None = None  # the suspect now running (at most one at a time)
        self.failed_in_a_row = 0  # engine failures since the last good step
        self.solo: JobState | None = None  # the item of an `alone` job running, nothing beside it

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, jobs: Iterable[Job]) -> Iterator[Outcome]:
        """Outcomes of `jobs` in finishing order (see the module docstring)."""
        self.live: set = set()  # items with audio in flight (their sinks are aborted if the run ends early)
        try:
            yield from self._run(jobs)
        finally:
            for item in self.live:
                if item.sink is not None:
                    item.sink.abort()
            self._park_engine()

    def _run(self, jobs: Iterable[Job]) -> Iterator[Outcome]:
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
            self._next_trial(ready)
            self._feed(ready, exhausted)
            finished = self._step(exhausted, ready)
            yield from self._failed()
            if finished is None:
                if exhausted and not ready and not self.suspects:
                    return
                if self.starved and not ready:
                    time.sleep(IDLE_WAIT)  # nothing runs; the jobs source said "ask again soon"
                continue
            for seq in finished:
                outcome = self._finished(seq, ready)
                if outcome is not None:
                    yield outcome
                yield from self._failed()

    def _step(self, exhausted: bool, ready: deque) -> list | None:
        """One engine step and its codec work; None when there is no work. The engine is held only in
        here, so when the next `_feed` rebuilds it the old one (its cache, its graph pools) is freed first."""
        engine = self.engine
        if engine is None or not engine.has_work():
            return None
        if exhausted:  # the last requests: longest budget first, so no long one runs on alone at the end
            engine.scheduler.longest_first = True
        try:
            finished = engine.step()
        except Exception as exc:  # noqa: BLE001 - a fault in one step fails the item at fault, not the run
            self._engine_failed(exc, ready)
            return []
        self.failed_in_a_row = 0
        self.in_engine.difference_update(finished)
        if self.audio is not None:  # every sequence's new frames to its codec stream; what is ready decoded
            self.audio.step(list(engine.scheduler.running), finished)
        return finished

    def _engine_failed(self, exc: Exception, ready: deque) -> None:
        """`engine.step()` raised, and which row caused it cannot be told. The engine is dropped (`_feed`
        builds a new one), the requests that had not started go back in front of `ready` in their order,
        and the items whose requests had started are judged:

        - one item alone in the failure, or a suspect among them (at most one runs at a time): it is at
          fault and fails; the others are tried again from their start, first in `ready`;
        - else every one of them becomes a suspect, tried again from its start, one at a time beside
          the other items (`_next_trial`): an item at fault fails on its trial, the others finish.

        An item that shares `MAX_INVOLVED` failures fails whatever the blame. A broken device (or
        `DEVICE_FAILURES` in a row) raises DeviceFailed instead: no item is at fault."""
        self.failed_in_a_row += 1
        self._check_device(exc)
        error = f"{type(exc).__name__} while generating: {_one_line(exc)}"
        seqs = sorted(self.in_engine, key=lambda seq: seq.id)  # engine ids grow in the order of `add`
        involved = list(dict.fromkeys(seq.tag[0] for seq in seqs
                                      if seq.admitted_at is not None and not seq.tag[0].dropped))
        for seq in seqs:
            if seq.admitted_at is not None:
                self._discard_stream(seq)
        ready.extendleft(reversed([(seq.tag[0], seq.tag[1], seq.params) for seq in seqs
                                   if seq.admitted_at is None and not seq.tag[0].dropped
                                   and seq.tag[0] not in involved]))
        self.in_engine.clear()
        self._drop_engine()
        suspects = [item for item in involved if item.suspect]
        blamed = suspects[0] if suspects else involved[0] if len(involved) == 1 else None
        if blamed is not None:
            self._fail(blamed, error, exc)
        again = [item for item in involved if item is not blamed]
        for item in reversed(again):  # innocent ones first in `ready`, in their order
            self._again(item, ready, error, exc, suspect=blamed is None)

    def _check_device(self, exc: Exception) -> None:
        """After a fault on the device: raise DeviceFailed if the device no longer computes, or if engines
        keep failing with no good step between them."""
        device = self.tts.ckpt.device
        broken = self.backend.broken()
        if broken is None and self.failed_in_a_row < DEVICE_FAILURES:
            return
        self._drop_engine()
        fault = f"{type(exc).__name__}: {_one_line(exc)}"
        if broken is not None:
            why = fault if broken == fault else f"{fault}; then a test computation raised {broken}"
            raise DeviceFailed(f"the {device} device stopped working ({why})") from exc
        raise DeviceFailed(f"{DEVICE_FAILURES} engines in a row failed on the {device} device with no good step "
                           f"between them (last: {fault}); it is taken for broken") from exc

    def _again(self, item: JobState, ready: deque, error: str, exc: Exception, suspect: bool) -> None:
        """Run `item` again from its start (its audio so far deleted): next in `ready`, or as a suspect
        waiting for its trial."""
        item.involved += 1
        if item.involved >= MAX_INVOLVED:
            self._fail(item, error, exc)
            return
        kept = [entry for entry in ready if entry[0] is not item]  # its pieces not yet in the engine
        ready.clear()
        ready.extend(kept)
        item.done.clear()
        item.chunks.clear()
        item.tries.clear()
        item.joiner = StreamJoiner(len(item.pieces), self.tts.sample_rate, lambda chunk: self._emit(item, chunk))
        if item.sink is not None:
            item.sink.abort()
            try:
                item.sink = self.sink(item.job)
            except OmniTTSError as again:  # the name was fine a moment ago: say what changed
                item.sink = None
                self._fail(item, str(again), again)
                return
        item.suspect = suspect
        if suspect:
            self.suspects.append(item)
        else:
            ready.extendleft(reversed(self._requests(item)))

    def _next_trial(self, ready: deque) -> None:
        """Put the next suspect in front of `ready` once the one on trial has finished or failed, and an
        engine has run a good step since the last failure (unless nothing else is left to run)."""
        trial = self.on_trial
        if trial is not None and not trial.dropped and trial in self.live:
            return
        if self.failed_in_a_row and (ready or (self.engine is not None and self.engine.has_work())):
            return
        self.on_trial = None
        while self.suspects:
            item = self.suspects.popleft()
            if not item.dropped:
                self.on_trial = item
                ready.extendleft(reversed(self._requests(item)))
                return

    def _requests(self, item: JobState) -> list:
        """`ready`'s entries for every piece of `item`."""
        return [(item, index, item.piece_params(index)) for index in range(len(item.pieces))]

    def _fail(self, item: JobState, error: str, exc: Exception) -> None:
        """Fail `item` while it runs: its outcome is queued for `_failed`, its partial audio deleted, its
        requests not yet started forgotten (those running finish and are discarded, as dropped ones are)."""
        if item.dropped:
            return
        item.dropped = True
        if item.sink is not None:
            item.sink.abort()
        self.live.discard(item)
        if self.engine is not None:
            self.in_engine.difference_update(self.engine.drop_waiting(lambda seq: seq.tag[0] is item))
        self.failures.append(Outcome(item.job, error=error, exception=exc, seed=item.seed, pieces=len(item.pieces),
                                     attempts=1 + max(item.tries.values(), default=0),
                                     timings={"total": round(_since(item.started), 4)}))

    def _failed(self) -> Iterator[Outcome]:
        while self.failures:
            yield self.failures.popleft()

    def _fill(self, source, ready: deque) -> tuple[list[Outcome], bool]:
        """Prepare jobs until `lookahead` requests wait; returns (failed outcomes, source exhausted).

        A source may yield None for "no job now, ask again" (an output directory's items all held by
        other writers); `starved` says so until it yields a job again."""
        failures = []
        waiting = len(self.engine.scheduler.waiting) if self.engine is not None else 0
        self.starved = False
        while len(ready) + waiting < self.lookahead:
            job = next(source, _END)
            if job is _END:
                return failures, True
            if job is None:
                self.starved = True
                break
            item, error = self._prepare(job)
            if error is not None:
                failures.append(error)
                continue
            ready.extend(self._requests(item))
        return failures, False

    def _prepare(self, job: Job) -> tuple[JobState | None, Outcome | None]:
        started = time.perf_counter()
        params = job.params
        seed = params.seed
        if seed is None and params.samples:
            seed = random.SystemRandom().randrange(2**31)  # recorded, so every result can be reproduced
        if job.fail is not None:
            return None, Outcome(job, error=job.fail, seed=seed, timings={"total": _since(started)})
        item = JobState(job, replace(params, seed=seed), seed, started=started)
        request = job.request
        try:
            if job.prompt is not None:
                item.pieces.append((request, job.prompt))
            else:
                texts = self.split(request.text, request.language) or [request.text]  # empty: prepare says why
                problem = pieces_problem(request.text, len(texts))
                if problem:
                    raise RequestError(problem)
                if len(texts) > 1 and request.ref_audio is not None and request.voice is None:
                    voice = self.tts.clone_voice(request.ref_audio, request.ref_text, request.x_vector_only)
                    request = replace(request, voice=voice)  # encode the reference once for all pieces
                for text in texts:
                    piece = request if len(texts) == 1 else replace(request, text=text)
                    item.pieces.append((piece, self.tts.prepare(piece)))
            item.shares = item.budget_shares()
            if warning := item.budget_warning():
                warnings.warn(warning, stacklevel=2)
            for index in range(len(item.pieces)):
                self._check_fits_alone(item, index)
        except Exception as exc:  # noqa: BLE001 - one item's input, however broken, fails only that item
            error = (str(exc) if isinstance(exc, OmniTTSError)
                     else f"{type(exc).__name__} while preparing: {_one_line(exc)}")
            return None, Outcome(job, error=error, exception=exc, seed=seed, timings={"total": _since(started)})
        if self.sink is not None:
            try:  # a sink may refuse an item (a file name the filesystem cannot hold): that item fails
                item.sink = self.sink(job)
            except OmniTTSError as exc:
                return None, Outcome(job, error=str(exc), exception=exc, seed=seed, timings={"total": _since(started)})
        item.prepare_s = _since(started)
        item.joiner = StreamJoiner(len(item.pieces), self.tts.sample_rate, lambda chunk: self._emit(item, chunk))
        auto_budget = params.max_frames is None and job.request.max_seconds is None
        item.incremental = not (self.retry_runaway and auto_budget and params.samples)
        self.live.add(item)
        return item, None

    def _emit(self, item: JobState, chunk: np.ndarray) -> None:
        """Joined audio of `item` that is final: to its sink (made when the item was prepared), or kept."""
        if item.sink is None:
            item.chunks.append(chunk)
            return
        item.sink.write(chunk)

    def _check_fits_alone(self, item: JobState, index: int) -> None:
        """Raise RequestError if this piece would not fit an engine even on its own (cache and prefill
        budgets, the talker's positions)."""
        prompt, params = item.pieces[index][1], item.piece_params(index)
        tts = self.tts
        plan(tts.ckpt, prompt.embeds.shape[0] + params.max_frames + 1, 1, prompt.trailing.shape[0],
             tts.kv_budget_bytes, tts.ckpt.device.type, tts.eager, tts.graph_buckets, tts.span_buckets,
             tts.max_prefill_tokens, prompt_positions=prompt.embeds.shape[0], longest_part=prompt.longest_part)

    def _feed(self, ready: deque, exhausted: bool) -> None:
        """Move prepared requests into the engine, (re)building it when one does not fit. An `alone` job's
        item waits for the engine to drain, and nothing joins it until it has finished (`solo`)."""
        while ready:
            item, index, params = ready[0]
            if item.dropped:
                ready.popleft()
                continue
            solo = self.solo
            if solo is not None and item is not solo and not solo.dropped and solo in self.live:
                return  # an item runs alone
            if item.job.alone and item is not solo:
                if self.engine is not None and self.engine.has_work():
                    return  # it runs alone: the others finish first
                self.solo = item
            if self.engine is None or not self._fits(item, index, params):
                if self.engine is not None and self.engine.has_work():
                    return  # drain the current engine first; it grows afterwards
                self.engine = self._build(ready, exhausted)
            ready.popleft()
            item.first_added = item.first_added or time.perf_counter()
            self.in_engine.add(self.engine.add(item.pieces[index][1], params, tag=(item, index)))

    def _fits(self, item: JobState, index: int, params: SamplingParams) -> bool:
        prompt, config = item.pieces[index][1], self.engine.config
        return (prompt.embeds.shape[0] + params.max_frames + 1 <= config.max_positions
                and prompt.trailing.shape[0] <= config.max_text_tokens)

    def _build(self, ready: deque, exhausted: bool) -> Engine:
        tts = self.tts
        prompts = [(item.pieces[index][1], params) for item, index, params in ready]
        positions = max(p.embeds.shape[0] + params.max_frames + 1 for p, params in prompts)
        text = max(p.trailing.shape[0] for p, _ in prompts)
        longest = max(p.embeds.shape[0] for p, _ in prompts)
        # Deterministic mode: the engine's batch (every frame's row count) is max_batch, however few items
        # are left, so a line's matrix shapes do not depend on the run's size.
        slots = min(tts.max_batch, len(prompts)) if exhausted and not self.full_batch else tts.max_batch
        config = plan(tts.ckpt, positions, slots, text, tts.kv_budget_bytes, tts.ckpt.device.type, tts.eager,
                      tts.graph_buckets, tts.span_buckets, tts.max_prefill_tokens, prompt_positions=longest,
                      full_batch=self.full_batch)
        if self.full_batch and config.max_num_seqs < tts.max_batch and not self.warned_small:
            self.warned_small = True
            warnings.warn(f"omnitts: --deterministic: lines needing {config.max_positions} talker positions fit only "
                          f"{config.max_num_seqs} of max_batch {tts.max_batch} rows in the K/V budget; the lines this "
                          "engine runs may get other codes than in an engine of max_batch rows", RuntimeWarning,
                          stacklevel=2)
        self._drop_engine()  # free the old engine's cache before allocating the new one
        idle, tts.idle_engine = tts.idle_engine, None
        if idle is not None and _covers(idle.config, config):
            self._graphs_before.subtract(idle.graph_stats())  # count only what this run captures
            idle.scheduler.longest_first = False  # the last run's end game; this run's jobs are still coming
            idle.on_admit = self._admitted
            return idle
        idle = None  # freed before the new engine allocates
        self.engines_built += 1
        with _fitting(tts, f"an engine of {config.max_num_seqs} rows x {config.max_positions} positions"):
            engine = Engine(tts.ckpt, config)
        engine.on_admit = self._admitted
        return engine

    def _admitted(self, seq) -> None:
        """The engine is about to prefill `seq` (its step may not return): the first time for an item,
        `started` hears of it."""
        item = seq.tag[0]
        if not item.admitted:
            item.admitted = True
            self.started(item.job)

    def _park_engine(self) -> None:
        """At the end of a run, hand an idle engine with graphs back to the TTS for the next call (a notebook's
        next `generate` reuses its captured graphs instead of capturing again). Only on graph devices (on the
        CPU, where nothing is captured, its memory is freed) and only when it ended cleanly."""
        engine = self.engine
        if engine is None or engine.has_work() or not engine.steps:
            return
        if not any(steps.captures for steps in engine.steps.values()):
            return
        self._drop_engine()
        self.tts.idle_engine = engine

    def _drop_engine(self) -> None:
        """Forget the engine (its cache and graphs are freed), keeping what its graph captures cost."""
        if self.engine is not None:
            self._graphs_before.update(self.engine.graph_stats())
        self.engine = None

    def graph_stats(self) -> dict:
        """Graph capture over the whole run (every engine built): graphs captured, the eager warm-up frames
        they cost, seconds spent capturing, and engines built; the prefill's graphs (`prefill_captures`,
        `prefill_capture_seconds`) and the codec's (`codec_captures`, `codec_capture_seconds`, where the codec's
        calls are captured) apart."""
        stats = Counter(self._graphs_before)
        if self.engine is not None:
            stats.update(self.engine.graph_stats())
        graphs = self.audio.codec.graphs if self.audio is not None else None
        codec = {"codec_captures": graphs.captures, "codec_capture_seconds": graphs.capture_seconds} if graphs else {}
        return {**stats, **codec, "engines": self.engines_built}

    def _drop(self, ready: deque) -> None:
        """Stop: forget everything not yet running; items with a dropped piece never complete."""
        for item, _, _ in ready:
            item.dropped = True
        ready.clear()
        for item in self.suspects:
            item.dropped = True
        self.suspects.clear()
        if self.engine is not None:
            for seq in self.engine.drop_waiting():
                seq.tag[0].dropped = True
                self.in_engine.discard(seq)

    # -- finishing --------------------------------------------------------------------------------
    def _finished(self, seq, ready: deque) -> Outcome | None:
        item, index = seq.tag
        if item.dropped:
            self._discard_stream(seq)
            if item.sink is not None:
                item.sink.abort()
            self.live.discard(item)
            return None
        auto_budget = item.job.params.max_frames is None and item.job.request.max_seconds is None
        if (seq.finish_reason == "length" and auto_budget and item.params.samples
                and item.tries.get(index, 0) < self.retry_runaway):
            item.tries[index] = item.tries.get(index, 0) + 1
            self._discard_stream(seq)  # the abandoned attempt's audio
            ready.appendleft((item, index, item.piece_params(index)))
            return None
        started = time.perf_counter()
        codes = seq.codes()
        if not self._last_audio(seq, codes):
            return None  # the item failed (queued for `_failed`)
        item.joiner.end(index)
        item.decode_s += _since(started)
        item.done[index] = (codes, seq.finish_reason)
        if len(item.done) < len(item.pieces):
            return None
        return self._complete(item)

    def _last_audio(self, seq, codes: np.ndarray) -> bool:
        """Hand a finished sequence's remaining audio to its item's joiner; False if decoding it raised
        (the item has failed)."""
        item, index = seq.tag
        if self.audio is not None and seq in self.audio:
            self.audio.read(seq)  # its audio still unread: the item's one wait for the codec (sink errors: the run's)
            if item.dropped:
                return False  # reading it failed the item
        try:
            if self.audio is None:
                from .reference import decode_codes

                audio = finite(decode_codes(self.tts.ckpt, torch.from_numpy(codes), seq.prompt.ref_codes))
            elif seq in self.audio:  # (no stream: EOS before the first frame, no audio)
                audio = self.audio.close(seq)
            else:
                return True
        except Exception as exc:  # noqa: BLE001 - one item's decode fails that item only
            self._decode_failed(seq, exc)
            return False
        item.joiner.add(index, audio)  # (writes to the sink: its errors are the run's, not the item's)
        return True

    def _decode_failed(self, seq, exc: Exception) -> None:
        """Decoding `seq`'s audio raised: its item fails, unless the device itself has broken (DeviceFailed)."""
        self._check_device(exc)
        self._discard_stream(seq)
        self._fail(seq.tag[0], f"{type(exc).__name__} while decoding: {_one_line(exc)}", exc)

    def _discard_stream(self, seq) -> None:
        """Forget `seq`'s codec stream, if it has one, without decoding the rest."""
        if self.audio is not None:
            self.audio.discard(seq)

    def _complete(self, item: JobState) -> Outcome:
        from ..result import Audio

        assert item.joiner.finished
        self.live.discard(item)
        parts = [item.done[i] for i in range(len(item.pieces))]
        rate = self.tts.sample_rate
        codes = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        reason = "length" if any(p[1] == "length" for p in parts) else "eos"
        if self.sink is None:
            samples = np.concatenate(item.chunks) if item.chunks else np.zeros(0, dtype=np.float32)
            count, sink = len(samples), None
        else:  # the audio is in the sink's file; the caller commits it
            sink = item.sink
            samples, count = None, sink.samples
        result = Audio(samples, rate, codes, reason, item.job.request.id, seed=item.seed)
        now = time.perf_counter()
        timings = {"prepare": item.prepare_s, "generate": now - (item.first_added or now) - item.decode_s,
                   "decode": item.decode_s, "total": now - item.started}
        attempts = 1 + max(item.tries.values(), default=0)
        seeds = None if item.seed is None else [item.piece_seed(i) for i in range(len(item.pieces))]
        return Outcome(item.job, result, seed=item.seed, seeds=seeds, attempts=attempts, pieces=len(item.pieces),
                       timings={k: round(v, 4) for k, v in timings.items()}, sink=sink, seconds=count / rate,
                       samples=count)


def _covers(have, want) -> bool:
    """Whether an engine configured as `have` can run what `want` was planned for (as many slots, positions
    and text tokens or more; every other setting the same; with `full_batch`, exactly as many slots: they
    are every frame's rows)."""
    if want.full_batch and have.max_num_seqs != want.max_num_seqs:
        return False
    return (have.max_num_seqs >= want.max_num_seqs and have.max_positions >= want.max_positions
            and have.max_text_tokens >= want.max_text_tokens
            and replace(have, max_num_seqs=want.max_num_seqs, max_positions=want.max_positions,
                        max_text_tokens=want.max_text_tokens) == want)


@contextmanager
def _fitting(tts, what: str):
    """An allocation that does not fit on the device (`device.out_of_memory`) becomes one OmniTTSError saying
    what did not fit under which max batch, instead of a traceback."""
    try:
        yield
    except Exception as exc:
        if not out_of_memory(exc):
            raise
        raise OmniTTSError(f"max batch {tts.max_batch}: {what} does not fit in {tts.ckpt.device.type} memory "
                           f"({_one_line(exc)}); lower --max-batch (max_batch in a recipe or in omnitts.load)") from None


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (a record's `error` is one line)."""
    return " ".join(str(exc).split()) or "(no message)"


def _since(start: float) -> float:
    return time.perf_counter() - start
