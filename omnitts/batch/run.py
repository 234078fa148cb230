"""The per-item loop of a manifest run: pending -> pipeline -> save -> report.

One function, used by the single-process `omnitts synth` and by each worker process of `--workers`
(workers.py), so both paths synthesize, save and resume the same way. It owns no terminal: the caller
loads the model (and says so where it likes) through `load`, decides when to stop through `stop`, and
hears of every saved record through `report`.
"""

from __future__ import annotations

import queue
import threading
from contextlib import closing
from typing import Callable, Iterable

_END = object()  # pending() yielded nothing at all
_STOP = object()  # the saver's last job
SAVE_QUEUE = 16  # finished items waiting to be saved at most (then the loop waits for the saver)


def run_items(batch, items: Iterable, load: Callable, stop: Callable[[], bool] = lambda: False,
              report: Callable[[dict], None] = lambda record: None, stats: dict | None = None,
              saving: Callable[[str], None] = lambda item_id: None) -> bool:
    """Synthesize the items of `items` that `batch` says are pending; returns whether the model was loaded.

    `load()` is called once, and only when some item is pending, and returns the loaded TTS (the
    caller may open its progress display or signal handlers there). `stop()` asks the pipeline to
    finish the running items and start no new ones. `report(record)` gets each results.jsonl record
    as soon as it is written (on the saver's thread), and `saving(id)` is called there just before its
    record is written (a process killed between the two has its record in results.jsonl, unreported:
    the workers' parent looks for it there, pool.py); `stats`, if given, gets the pipeline's `graph_stats()`
    at the end. An error raised while saving (a full disk) or by a signal closes the pipeline, which
    aborts the running items' temporary files, and propagates; items finished but not yet saved are
    saved first after a signal, and aborted after a saving error.

    The batch's claims hear what the pipeline does (`Batch.started`: an item entered the engine), that a
    stop was asked (`Writer.stopping`) and that the device broke (DeviceFailed: `Writer.abandon_running`,
    after the finished items are saved), so that a death of this process is counted against the items it
    was running, and only those (batch/claims.py).
    """
    from ..engine.pipeline import Pipeline
    from ..errors import DeviceFailed

    pending = batch.pending(items)
    first = next(pending, _END)  # may be None with claims: "nothing can start now", still work to wait for
    if first is _END or stop():  # a stop before the load (a worker's early Ctrl-C): nothing starts
        return False
    tts = load()
    batch.sample_rate = tts.sample_rate
    asked = []

    def stopping() -> bool:
        if stop():
            if not asked:
                asked.append(True)
                batch.writer.stopping()
            return True
        return saver.failed

    pipeline = Pipeline(tts, retry_runaway=batch.settings.retry_runaway, stop=stopping,
                        split=batch.settings.splitter(), sink=batch.sink, started=batch.started)
    saver = _Saver(batch, report, saving)  # started last: nothing that can raise stands between it and `close`
    try:
        with closing(pipeline.run(_chain(first, pending))) as outcomes:
            for outcome in outcomes:
                saver.submit(outcome)
    except DeviceFailed:
        saver.close()  # what finished is saved (and its claims released) first
        batch.writer.abandon_running()
        raise
    finally:
        saver.close()
        if stats is not None:
            stats.update(pipeline.graph_stats())
    saver.check()  # a saving error the loop did not meet (the pipeline had stopped for it)
    return True


class _Saver:
    """`batch.save` and `report` for each finished item, in order, on a thread of its own.

    Saving an item is file work the device does not wait for: the audio file's last write and close, an
    fsync, a rename, the result line and its fsync (~19 ms an item on an H200 machine's disk, where a
    batch of 64 finishes several items a step). On this thread it overlaps the next frames. The order of
    the records stays the order items finish, and every guarantee of `Batch.save` holds (a record only
    for a file in place). After an error (a full disk) nothing more is saved: the items queued behind it
    are aborted (their temporary files deleted, their claims released), `failed` tells the pipeline to
    start no more items, and the error is raised in the caller's thread by the next `submit` or by
    `check`. `close` waits for the queued items, so none is lost when the run ends or is interrupted.
    """

    def __init__(self, batch, report: Callable[[dict], None], saving: Callable[[str], None] = lambda item_id: None):
        self.batch, self.report, self.saving = batch, report, saving
        self.error: BaseException | None = None
        self.queue: queue.Queue = queue.Queue(SAVE_QUEUE)
        # Not a daemon: an interpreter that exits while items wait still saves them first.
        self.thread = threading.Thread(target=self._loop, name="omnitts-saver")
        self.thread.start()

    @property
    def failed(self) -> bool:
        return self.error is not None

    def submit(self, outcome) -> None:
        if self.error is not None:
            self._drop(outcome)
            raise self.error
        self.batch.writer.settled(outcome.job.request.id)  # out of the engine: a death now is not its doing
        self.queue.put(outcome)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Save (or, after an error, abort) what is queued, then end the thread. Idempotent."""
        if self.thread.is_alive():
            self.queue.put(_STOP)
            self.thread.join()

    def _loop(self) -> None:
        while (outcome := self.queue.get()) is not _STOP:
            if self.error is not None:
                try:
                    self._drop(outcome)
                except BaseException:  # noqa: BLE001 - the first error stands; the loop must go on draining
                    pass
                continue
            try:
                self.saving(outcome.job.request.id)
                record = self.batch.save(outcome)  # on an error it has undone its own files and claim
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                self.error = exc
                continue
            try:
                self.report(record)
            except BaseException as exc:  # noqa: BLE001 - the record is written; the run stops
                self.error = exc

    def _drop(self, outcome) -> None:
        """An item not saved after an error: its temporary file deleted, its claim released (save had not run)."""
        try:
            if outcome.sink is not None:
                outcome.sink.abort()
        finally:
            self.batch.writer.release(outcome.job.request.id, recorded=False)


def _chain(first, rest):
    yield first
    yield from rest
