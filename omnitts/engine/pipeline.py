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
- faults (`faults.Faults`): an exception while preparing, generating or decoding fails the item at
  fault, never the run; a broken device ends the run with `DeviceFailed`.
A job is made ready to run in preparation.py (`prepare`). Outcomes come out in finishing order. The
pipeline never prints.
"""

from __future__ import annotations

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
from ..errors import OmniTTSError
from ..models.codec_streams import CodecStreams
from ..params import SamplingParams
from ..text.split import split_text
from .decoding import AudioStreams, finite
from .engine import Engine, plan
from .faults import Faults
from .jobs import Job, JobState, Outcome, one_line, since
from .preparation import prepare

__all__ = ["Job", "Outcome", "Pipeline"]


_END = object()  # a jobs source that has nothing more
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
        self.faults = Faults(self)  # failed items' outcomes, suspects and their trials, the device's health
        with _fitting(tts, "the codec's state for that many streams"):
            streams = (CodecStreams(tts.ckpt.codec, tts.codec_chunk_frames, tts.max_batch,
                                         tile_frames=backend.codec_tile_frames, upload=uploader(tts.ckpt.device),
                                         to_host=backend.to_host, gather=0 if alone else backend.codec_gather,
                                         fixed=fixed, max_rows=1 if alone else None,
                                         graphs=backend.call_graphs("codec", False if alone else None) if fixed
                                         else None, free_memory=backend.free_memory())
                       if stream_decode else None)
        # The running sequences' codec streams (None: each utterance is decoded whole when it ends).
        self.audio = AudioStreams(streams, self.faults.decode_failed) if streams is not None else None
        self.starved = False  # the jobs source last said "nothing now" (None)
        self.in_engine: set = set()  # sequences added to the engine and not yet returned finished
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
            self.faults.next_trial(ready)
            self._feed(ready, exhausted)
            finished = self._step(exhausted, ready)
            yield from self.faults.failed()
            if finished is None:
                if exhausted and not ready and not self.faults.suspects:
                    return
                if self.starved and not ready:
                    time.sleep(IDLE_WAIT)  # nothing runs; the jobs source said "ask again soon"
                continue
            for seq in finished:
                outcome = self._finished(seq, ready)
                if outcome is not None:
                    yield outcome
                yield from self.faults.failed()

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
            self.faults.engine_failed(exc, ready)
            return []
        self.faults.failed_in_a_row = 0
        self.in_engine.difference_update(finished)
        if self.audio is not None:  # every sequence's new frames to its codec stream; what is ready decoded
            self.audio.step(list(engine.scheduler.running), finished)
        return finished

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
            item, error = prepare(job, self.tts, self.split, self.sink, self.retry_runaway)
            if error is not None:
                failures.append(error)
                continue
            self.live.add(item)
            ready.extend(item.ready_entries())
        return failures, False

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
        self.drop_engine()  # free the old engine's cache before allocating the new one
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
        self.drop_engine()
        self.tts.idle_engine = engine

    def drop_engine(self) -> None:
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
        for item in self.faults.suspects:
            item.dropped = True
        self.faults.suspects.clear()
        if self.engine is not None:
            for seq in self.engine.drop_waiting():
                seq.tag[0].dropped = True
                self.in_engine.discard(seq)

    # -- finishing --------------------------------------------------------------------------------
    def _finished(self, seq, ready: deque) -> Outcome | None:
        item, index = seq.tag
        if item.dropped:
            self.discard_stream(seq)
            if item.sink is not None:
                item.sink.abort()
            self.live.discard(item)
            return None
        auto_budget = item.job.params.max_frames is None and item.job.request.max_seconds is None
        if (seq.finish_reason == "length" and auto_budget and item.params.samples
                and item.tries.get(index, 0) < self.retry_runaway):
            item.tries[index] = item.tries.get(index, 0) + 1
            self.discard_stream(seq)  # the abandoned attempt's audio
            ready.appendleft((item, index, item.piece_params(index)))
            return None
        started = time.perf_counter()
        codes = seq.codes()
        if not self._last_audio(seq, codes):
            return None  # the item failed (queued for `Faults.failed`)
        item.joiner.end(index)
        item.decode_s += since(started)
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
            self.faults.decode_failed(seq, exc)
            return False
        item.joiner.add(index, audio)  # (writes to the sink: its errors are the run's, not the item's)
        return True

    def discard_stream(self, seq) -> None:
        """Forget `seq`'s codec stream, if it has one, without decoding the rest."""
        if self.audio is not None:
            self.audio.discard(seq)

    def _complete(self, item: JobState) -> Outcome:
        assert item.joiner.finished
        self.live.discard(item)
        return item.outcome(self.tts.sample_rate, in_sink=self.sink is not None)


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
                           f"({one_line(exc)}); lower --max-batch (max_batch in a recipe or in omnitts.load)") from None

