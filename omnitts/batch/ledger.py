"""`results.jsonl`: one line per finished item, the record a re-run resumes from.

Each line: id, status ("ok" | "error"), path, seconds, frames, finish_reason ("eos" | "length" |
"error"), seed, error, timings. Lines are appended and flushed one at a time, after the item's audio
file is in place (atomic rename), so a line never points at a missing or half-written file; a line
cut off by a kill is ignored when reading.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

NAME = "results.jsonl"


class Done(NamedTuple):
    """What is kept of a good record: only what resuming and exporting read (memory per id stays small)."""

    path: str
    seconds: float
    frames: int
    seed: int | None


class Ledger:
    def __init__(self, out: Path):
        self.path = Path(out) / NAME
        self.done: dict[str, Done] = {}  # id -> its last good record
        self.failed: dict[str, str] = {}  # id -> the error of its last record
        if self.path.exists():
            for record in self._read():
                self._note(record)

    def _read(self):
        with open(self.path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by a kill: that item simply runs again
                if isinstance(record, dict) and isinstance(record.get("id"), str):
                    yield record

    def is_done(self, item_id: str, out: Path) -> bool:
        """Done = a good record whose audio file still exists and decodes."""
        record = self.done.get(item_id)
        if record is None:
            return False
        try:
            import soundfile as sf

            sf.info(str(Path(out) / record.path))
            return True
        except Exception:  # missing or unreadable file: synthesize again
            return False

    def write(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self._note(record)

    def _note(self, record: dict) -> None:
        """The latest record of an id wins."""
        item_id = record["id"]
        if record.get("status") == "ok":
            self.done[item_id] = Done(record["path"], record["seconds"], record["frames"], record.get("seed"))
            self.failed.pop(item_id, None)
        else:
            self.failed[item_id] = record.get("error") or ""
            self.done.pop(item_id, None)


def remove_leftovers(out: Path) -> int:
    """Delete temporary files of an interrupted run (they never count as done)."""
    removed = 0
    for tmp in Path(out).glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed
