"""The per-item loop of a manifest run: pending -> pipeline -> save -> report.

One function, used by the single-process `omnitts synth` and by each worker process of `--workers`
(workers.py), so both paths synthesize, save and resume the same way. It owns no terminal: the caller
loads the model (and says so where it likes) through `load`, decides when to stop through `stop`, and
hears of every saved record through `report`.
"""

from __future__ import annotations

from contextlib import closing
from typing import Callable, Iterable

_END = object()  # pending() yielded nothing at all


def run_items(batch, items: Iterable, load: Callable, stop: Callable[[], bool] = lambda: False,
              report: Callable[[dict], None] = lambda record: None, stats: dict | None = None) -> bool:
    """Synthesize the items of `items` that `batch` says are pending; returns whether the model was loaded.

    `load()` is called once, and only when some item is pending, and returns the loaded TTS (the
    caller may open its progress display or signal handlers there). `stop()` asks the pipeline to
    finish the running items and start no new ones. `report(record)` gets each results.jsonl record
    as soon as it is written; `stats`, if given, gets the pipeline's `graph_stats()` at the end. An error raised while saving (a full disk) or by a signal closes the
    pipeline, which aborts the running items' temporary files, and propagates.
    """
    from ..engine.pipeline import Pipeline

    pending = batch.pending(items)
    first = next(pending, _END)  # may be None with claims: "nothing can start now", still work to wait for
    if first is _END or stop():  # a stop before the load (a worker's early Ctrl-C): nothing starts
        return False
    tts = load()
    batch.sample_rate = tts.sample_rate
    pipeline = Pipeline(tts, retry_runaway=batch.settings.retry_runaway, stop=stop,
                        split=batch.settings.splitter(), sink=batch.sink)
    try:
        with closing(pipeline.run(_chain(first, pending))) as outcomes:
            for outcome in outcomes:
                report(batch.save(outcome))
    finally:
        if stats is not None:
            stats.update(pipeline.graph_stats())
    return True


def _chain(first, rest):
    yield first
    yield from rest
