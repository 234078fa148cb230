"""What a pipeline does when something fails (`Faults`, one per `Pipeline`).

- faults: an exception while preparing, generating or decoding fails the item at fault, never the
  run. One from `engine.step()` cannot be pinned on a row: the engine, whose state may be broken, is
  dropped, the requests that had not started go on in a new one, and the items whose requests had
  started are tried again from their start ("suspects"), one at a time beside the other items, so that
  the item at fault fails alone (error "ExceptionType while generating: ...") and the others finish as
  in a clean run (`engine_failed`). One from the codec fails the item whose stream raised ("... while
  decoding: ..."; a batched codec call that raises is retried row by row, see `CodecStreams`). A failed
  item's other pieces are forgotten or, if already running, finish unseen. Errors writing audio (a
  sink's OSError) are not the item's fault: they end the run;
- a broken device: after each fault on the device the backend is asked whether the device still
  computes (`Backend.broken`: a sticky CUDA or NPU error fails every later call), and
  `DEVICE_FAILURES` engines failing in a row with no good step between them mean the same: then the
  run ends with `DeviceFailed`, and the items in flight are left for a re-run, not recorded as failed.

It works on its pipeline's state (the engine, the sequences in it, the items with audio in flight); the
pipeline's loop calls it where a step or a decode raised, and yields the outcomes it queued.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

from ..errors import DeviceFailed, OmniTTSError
from .jobs import JobState, Outcome, one_line, since
from .join import StreamJoiner

# Engines failing in a row, with no good step between them, that mean a broken device. A suspect's trial
# starts only once an engine has run a good step since the last failure (`next_trial`), so items at
# fault make engines fail in a row only where a fresh engine's first step holds a new one.
DEVICE_FAILURES = 3
MAX_INVOLVED = 3  # engine failures one item may share before it is failed without its own trial


class Faults:
    """The failures of one `Pipeline` (`pipeline`): outcomes of items that failed while running, the suspects
    of failed engine steps and their trials, and whether the device still works; see the module docstring."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.failures: deque = deque()  # outcomes of items that failed while running, not yet yielded
        self.suspects: deque = deque()  # items waiting for their trial (see `engine_failed`)
        self.on_trial: JobState | None = None  # the suspect now running (at most one at a time)
        self.failed_in_a_row = 0  # engine failures since the last good step

    def engine_failed(self, exc: Exception, ready: deque) -> None:
        """`engine.step()` raised, and which row caused it cannot be told. The engine is dropped (the pipeline's
        `_feed` builds a new one), the requests that had not started go back in front of `ready` in their
        order, and the items whose requests had started are judged:

        - one item alone in the failure, or a suspect among them (at most one runs at a time): it is at
          fault and fails; the others are tried again from their start, first in `ready`;
        - else every one of them becomes a suspect, tried again from its start, one at a time beside
          the other items (`next_trial`): an item at fault fails on its trial, the others finish.

        An item that shares `MAX_INVOLVED` failures fails whatever the blame. A broken device (or
        `DEVICE_FAILURES` in a row) raises DeviceFailed instead: no item is at fault."""
        pipeline = self.pipeline
        self.failed_in_a_row += 1
        self.check_device(exc)
        error = f"{type(exc).__name__} while generating: {one_line(exc)}"
        seqs = sorted(pipeline.in_engine, key=lambda seq: seq.id)  # engine ids grow in the order of `add`
        involved = list(dict.fromkeys(seq.tag[0] for seq in seqs
                                      if seq.admitted_at is not None and not seq.tag[0].dropped))
        for seq in seqs:
            if seq.admitted_at is not None:
                pipeline.discard_stream(seq)
        ready.extendleft(reversed([(seq.tag[0], seq.tag[1], seq.params) for seq in seqs
                                   if seq.admitted_at is None and not seq.tag[0].dropped
                                   and seq.tag[0] not in involved]))
        pipeline.in_engine.clear()
        pipeline.drop_engine()
        suspects = [item for item in involved if item.suspect]
        blamed = suspects[0] if suspects else involved[0] if len(involved) == 1 else None
        if blamed is not None:
            self.fail(blamed, error, exc)
        again = [item for item in involved if item is not blamed]
        for item in reversed(again):  # innocent ones first in `ready`, in their order
            self._again(item, ready, error, exc, suspect=blamed is None)

    def decode_failed(self, seq, exc: Exception) -> None:
        """Decoding `seq`'s audio raised: its item fails, unless the device itself has broken (DeviceFailed)."""
        self.check_device(exc)
        self.pipeline.discard_stream(seq)
        self.fail(seq.tag[0], f"{type(exc).__name__} while decoding: {one_line(exc)}", exc)

    def check_device(self, exc: Exception) -> None:
        """After a fault on the device: raise DeviceFailed if the device no longer computes, or if engines
        keep failing with no good step between them."""
        pipeline = self.pipeline
        device = pipeline.tts.ckpt.device
        broken = pipeline.backend.broken()
        if broken is None and self.failed_in_a_row < DEVICE_FAILURES:
            return
        pipeline.drop_engine()
        fault = f"{type(exc).__name__}: {one_line(exc)}"
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
            self.fail(item, error, exc)
            return
        kept = [entry for entry in ready if entry[0] is not item]  # its pieces not yet in the engine
        ready.clear()
        ready.extend(kept)
        item.done.clear()
        item.chunks.clear()
        item.tries.clear()
        item.joiner = StreamJoiner(len(item.pieces), self.pipeline.tts.sample_rate, item.emit)
        if item.sink is not None:
            item.sink.abort()
            try:
                item.sink = self.pipeline.sink(item.job)
            except OmniTTSError as again:  # the name was fine a moment ago: say what changed
                item.sink = None
                self.fail(item, str(again), again)
                return
        item.suspect = suspect
        if suspect:
            self.suspects.append(item)
        else:
            ready.extendleft(reversed(item.ready_entries()))

    def next_trial(self, ready: deque) -> None:
        """Put the next suspect in front of `ready` once the one on trial has finished or failed, and an
        engine has run a good step since the last failure (unless nothing else is left to run)."""
        pipeline = self.pipeline
        trial = self.on_trial
        if trial is not None and not trial.dropped and trial in pipeline.live:
            return
        if self.failed_in_a_row and (ready or (pipeline.engine is not None and pipeline.engine.has_work())):
            return
        self.on_trial = None
        while self.suspects:
            item = self.suspects.popleft()
            if not item.dropped:
                self.on_trial = item
                ready.extendleft(reversed(item.ready_entries()))
                return

    def fail(self, item: JobState, error: str, exc: Exception) -> None:
        """Fail `item` while it runs: its outcome is queued for `failed`, its partial audio deleted, its
        requests not yet started forgotten (those running finish and are discarded, as dropped ones are)."""
        if item.dropped:
            return
        item.dropped = True
        if item.sink is not None:
            item.sink.abort()
        pipeline = self.pipeline
        pipeline.live.discard(item)
        if pipeline.engine is not None:
            pipeline.in_engine.difference_update(pipeline.engine.drop_waiting(lambda seq: seq.tag[0] is item))
        self.failures.append(Outcome(item.job, error=error, exception=exc, seed=item.seed, pieces=len(item.pieces),
                                     attempts=1 + max(item.tries.values(), default=0),
                                     timings={"total": round(since(item.started), 4)}))

    def failed(self) -> Iterator[Outcome]:
        """The queued outcomes of failed items, each once."""
        while self.failures:
            yield self.failures.popleft()
