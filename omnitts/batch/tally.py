"""A run's counts: what the progress bar and the closing summary show (done, failed, skipped...).

Counted by the run's `Batch` (outdir.py), the workers' parent (pool.py: every worker's counts added) and the
`--ray` command; the CLI shows them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

SHOWN_ERRORS = 20  # failures listed in the closing summary


@dataclass
class Tally:
    """Counts for the progress bar and the closing summary."""

    done: int = 0
    failed: int = 0
    skipped: int = 0  # not run: done earlier, or failed earlier (below)
    earlier_failed: int = 0  # skipped because an earlier run failed them (no audio; --retry-failed runs them)
    changed: int = 0  # recorded again because the line or the options changed since their record, or their file
    damaged: int = 0  # of `changed`: those whose line and options had not changed, but their file was damaged or gone
    others: int = 0  # recorded by another writer of the same directory during this run (not run here)
    seconds: float = 0.0  # audio written in this run
    errors: list = field(default_factory=list)  # (id, message) of the first SHOWN_ERRORS failures
    started: float = field(default_factory=time.time)
    # done, changed, seconds and failures are counted on the run's saver thread (batch/run.py), the rest on
    # its main thread; failures on both (bad lines are recorded as the manifest is read).
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def rerun(self, damaged: bool) -> None:
        """One item recorded again over its earlier record: its line or the options changed, or (`damaged`) they
        had not, but its file was damaged or gone. Every path's counts go through here (`Batch.save`, and the
        `--ray` command for the rows its actors return), so their summaries agree."""
        self.changed += 1
        self.damaged += damaged

    def fail(self, item_id: str, message: str) -> None:
        with self.lock:
            self.failed += 1
            if len(self.errors) < SHOWN_ERRORS:  # the rest are in results.jsonl; memory stays flat
                self.errors.append((item_id, message))

    @property
    def wall(self) -> float:
        return time.time() - self.started

    @property
    def realtime(self) -> float:
        return self.seconds / self.wall if self.wall > 0 else 0.0
