"""`results.jsonl`: the record of an output directory, which resume, export and summaries read.

Each line is one JSON object: id, status ("ok" | "error"), path, seconds, samples, frames,
finish_reason ("eos" | "length" | "error"), seed, seeds, error, attempts, pieces, timings, fingerprint,
codes, run (see docs/outputs.md). A line is appended and fsynced only after the item's audio file is in place
(atomic rename), so a line never points at a missing or half-written file.

The log is append-only, and **the last record of an id wins**: an item that runs again (a retried
failure, a damaged file redone, a runaway retry's rerun) appends a second line and earlier ones stop
counting. Every reader applies that rule through `records` (here: `Ledger`, `read_results`); a line
torn by a kill is skipped. Appending, not rewriting, is what lets several writers share one
directory (batch/claims.py): each line is one write under the log's lock, and a compaction would race them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
from pathlib import Path
from typing import Iterator, NamedTuple

from ..errors import OmniTTSError
from ..io import user_path
from .fingerprint import same_print

NAME = "results.jsonl"
CODES = "codes.npy"  # in `Ledger.named`: an ok record of the id named its `ID.codes.npy` (or may have: older records)


def new_run() -> str:
    """A run token: what the records of one command carry, its workers' and Ray actors' too (`Ledger.ours`)."""
    return secrets.token_hex(8)


def record(item_id, status, path=None, seconds=None, samples=None, frames=None, finish_reason=None, seed=None,
           seeds=None, error=None, attempts=None, pieces=None, timings=None, fingerprint=None, codes=None,
           run=None) -> dict:
    """One results.jsonl line (the same keys for every status; docs/outputs.md describes them)."""
    return {"id": item_id, "status": status, "path": path, "seconds": seconds, "samples": samples,
            "frames": frames, "finish_reason": finish_reason or ("error" if status == "error" else None),
            "seed": seed, "seeds": seeds, "error": error, "attempts": attempts, "pieces": pieces,
            "timings": timings, "fingerprint": fingerprint, "codes": codes, "run": run}


class LedgerError(OmniTTSError):
    """The result log cannot be used (it would write outside the output directory)."""


class Done(NamedTuple):
    """What is kept of a good record: only what resuming and exporting read (memory per id stays small)."""

    path: str
    seconds: float
    frames: int
    seed: int | None
    samples: int | None  # None in records written before omnitts recorded it
    fingerprint: str | None = None  # what made the audio (batch/fingerprint.py); None in older records
    finish_reason: str | None = None  # "eos" or "length"
    attempts: int | None = None  # 1 + runaway retries of the piece retried most (None in older records)
    codes: bool | None = None  # whether it names its `ID.codes.npy` (None: written before records said so)


def records(out: Path) -> Iterator[dict]:
    """Every readable record of output directory `out`, in file order (torn lines skipped)."""
    path = Path(out) / NAME
    if not path.exists():
        return
    with open(path, "rb") as handle:
        for line in handle:
            record = _parse(line)
            if record is not None:
                yield record


def read_results(out) -> dict[str, dict]:
    """{id: its last record} of output directory `out` (the record that counts; see the module docstring);
    {} for a directory nothing was recorded in yet. `~` is the home folder.

    Raises:
        FileNotFoundError: `out` is not a directory (a mistyped path is not an empty run)."""
    out = user_path(out, "out")
    if out.is_file():  # the log itself, or another file: "no such output directory" sent one looking for a typo
        raise FileNotFoundError(f"{out}: a file, not an output directory; give the directory it is in "
                                f"({str(out.parent)!r})")
    if not out.is_dir():
        raise FileNotFoundError(f"{out}: no such output directory")
    return {record["id"]: record for record in records(out)}


class Ledger:
    """What `out`'s result log says, kept current while this writer and others append to it.

    Several writers may share the log (batch/claims.py): each appends under an exclusive `flock`, one
    `write` per line, so lines never interleave. Before appending, a writer reads the lines the others
    appended since its last read (`refresh` does that too, without writing); ids whose records came from
    another writer after this Ledger opened are in `arrived`, those of them that replaced an earlier
    run's record are in `replaced`, and those whose latest such record another command wrote (not this
    command's workers nor the actors of this Ray run, whose records carry its `run` token) are in `theirs`:
    `ours` tells.
    """

    def __init__(self, out: Path, since: int | None = None, run: str | None = None):
        """`since`: where this run began in the log (bytes), when it began before this Ledger opened (the
        workers of one command, the actors of one Ray run): records after it are `arrived`. `run`: this run's
        token (`new_run`), which tells the records of its other processes from other commands' (`ours`);
        None: it cannot be told, and every record arrived counts as this run's."""
        self.path = Path(out) / NAME
        self.done: dict[str, Done] = {}  # id -> its last record, when that is good
        self.failed: dict[str, str] = {}  # id -> the error of its last record, when that failed
        self.failed_prints: dict[str, str | None] = {}  # id -> that failed record's fingerprint
        self.arrived: set[str] = set()  # ids another writer recorded after this Ledger opened
        self.run = run
        self.theirs: set[str] = set()  # of `arrived`: ids last recorded by another command (few: memory stays flat)
        # id -> for an arrived id that replaced an earlier run's record: `rerun_of` then (a damaged file or a
        # change), as `Batch.rerun` says for the items a writer runs itself
        self.replaced: dict[str, bool] = {}
        # id -> the suffixes of the files `ID.SUFFIX` its ok records named ("wav", "flac"; CODES for `codes`), in
        # any run: the files of its earlier versions, which `Batch._drop_earlier` may delete (a file no record
        # named is not omnitts'). Shared frozensets: memory per id stays one dict slot.
        self.named: dict[str, frozenset[str]] = {}
        self.offset = 0  # bytes of the log read so far (whole lines only)
        self._lock = threading.RLock()  # reads and writes of this object's state, between threads
        self._track = False  # what is there at the start is the earlier runs' work, not `arrived`
        self._read(upto=since)
        self._track = True
        if since is not None:
            self._read()

    def is_done(self, item_id: str, out: Path) -> bool:
        """Done = the id's last record is good and its audio file still holds what the record says."""
        record = self.done.get(item_id)
        return record is not None and audio_problem(Path(out) / record.path, record) is None

    def ours(self, item_id: str) -> bool:
        """Whether another process of this run (its `run` token) recorded `item_id` after this Ledger opened,
        and no other command did after it."""
        return item_id in self.arrived and item_id not in self.theirs

    def refresh(self) -> None:
        """Read the records other writers appended since the last read."""
        with self._lock:
            self._read()

    def write(self, record: dict) -> None:
        """Append `record` as one line, fsynced, under the log's lock (other writers wait for one line).
        Thread-safe: a run's saver thread writes while its main thread refreshes (batch/run.py)."""
        self.write_all([record])

    def write_all(self, records: list[dict], unless=None) -> None:
        """Append `records`, a line each, with one fsync: all of them or, if the write fails, none. `unless`
        (a record -> bool) drops those it is true of, asked under the log's lock once the other writers'
        lines are read: what no other writer appended first is written exactly once."""
        if not records:
            return
        with self._lock:
            self._write(records, unless)

    def _write(self, records: list[dict], unless=None) -> None:
        """`write_all`, with this Ledger's thread lock held.

        The log is never followed through a symbolic link (it would write outside the output directory),
        and a last line torn by a killed writer is closed first, so the new record is never glued to it.
        A write that fails (a full disk, a signal) is undone: the log is cut back to its length before, so
        no torn line is left, and the error is raised.
        """
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.path, flags, 0o666)
        except OSError:
            if self.path.is_symlink():
                raise LedgerError(f"{self.path}: is a symbolic link; omnitts writes only inside the output "
                                  "directory (replace the link with a file, or choose another --out)") from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by close
            size = os.lseek(fd, 0, os.SEEK_END)
            if size > self.offset:
                self._read(upto=size)  # the others' lines first: ours comes after them
            if unless is not None:
                records = [record for record in records if not unless(record)]
                if not records:
                    return
            # A lone surrogate (a file name that is not UTF-8, inside an error message) is written as its
            # JSON escape: inside a JSON string, backslashreplace's "\udcff" is one.
            data = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode(
                "utf-8", "backslashreplace")
            if size and not _ends_with_newline(self.path):
                data = b"\n" + data
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
            self.offset = size + len(data)  # a torn fragment before our lines is skipped with them
        finally:
            os.close(fd)
        for record in records:
            self._note(record)

    def _read(self, upto: int | None = None) -> None:
        """Note the whole lines from `offset` on (to byte `upto`); a line still being written is left.

        A last line without its newline that is a whole record counts, as `records` reads it (one saved by
        hand in an editor that adds none): a line being written, or torn, is not yet a whole JSON object
        (a JSON object's text ends with the brace that closes it, and no shorter part of it parses)."""
        try:
            handle = open(self.path, "rb")
        except FileNotFoundError:
            return
        with handle:
            handle.seek(self.offset)
            for line in handle:  # streamed: a log of millions of lines is never held whole
                if (upto is not None and self.offset + len(line) > upto) or (
                        not line.endswith(b"\n") and _parse(line) is None):
                    break  # still being written by another writer, or torn by a kill: read it next time
                self.offset += len(line)
                record = _parse(line)
                if record is not None:
                    if self._track:
                        self._arrive(record)
                    self._note(record)

    def _arrive(self, record: dict) -> None:
        """Note `record`, another writer's, arrived during this run (before `_note`: what it replaces is still
        here)."""
        item_id = record["id"]
        if self.run is None or record.get("run") == self.run:
            self.theirs.discard(item_id)
        else:
            self.theirs.add(item_id)
        if item_id in self.arrived:
            return  # what it replaced was this run's too; the first arrival saw the earlier run's record
        self.arrived.add(item_id)
        why = self.rerun_of(item_id, record.get("fingerprint") or "")
        if why is not None:
            self.replaced[item_id] = why

    def rerun_of(self, item_id: str, current: str) -> bool | None:
        """Why `item_id`, run again now with fingerprint `current`, replaces its record: True for a damaged
        or missing file (its good record made as now), False for a change of its line or the options since
        (a good or a failed record); None for no record, or a failure tried again as it was (--retry-failed)."""
        done = self.done.get(item_id)
        if done is not None:
            return same_print(done.fingerprint, current)
        if item_id in self.failed and not same_print(self.failed_prints[item_id], current, old=False):
            return False
        return None

    def _note(self, record: dict) -> None:
        """The latest record of an id wins."""
        item_id = record["id"]
        if record.get("status") == "ok":
            # A record without the `codes` key was written before omnitts recorded them: it may have had codes.
            codes = record["codes"] == f"{item_id}.{CODES}" if "codes" in record else None
            self.done[item_id] = Done(record["path"], record["seconds"], record["frames"], record.get("seed"),
                                      record.get("samples"), record.get("fingerprint"), record.get("finish_reason"),
                                      record.get("attempts"), codes)
            self.failed.pop(item_id, None)
            self.failed_prints.pop(item_id, None)
            stem, _, suffix = record["path"].rpartition(".")
            new = ({suffix} if stem == item_id else set()) | ({CODES} if codes is not False else set())
            if not new <= self.named.get(item_id, frozenset()):
                names = self.named.get(item_id, frozenset()) | new
                self.named[item_id] = _SHARED.setdefault(names, names)
        else:
            self.failed[item_id] = record.get("error") or ""
            self.failed_prints[item_id] = record.get("fingerprint")
            self.done.pop(item_id, None)


_SHARED: dict[frozenset, frozenset] = {}  # the few distinct sets of suffixes, each kept once (Ledger.named)


def _parse(line: bytes) -> dict | None:
    """A record, or None for a line torn by a kill (that item simply runs again) or not a record: a good
    one names its file in `out` (a plain name) and says how long it is; a line edited by hand or written
    by another tool without that is passed over, as a torn one is."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        return None
    if record.get("status") == "ok":
        path, samples = record.get("path"), record.get("samples")
        if not (isinstance(path, str) and path and _plain_name(path) and not path.startswith(".")
                and _number(record.get("seconds")) and isinstance(record.get("frames"), int)
                and (samples is None or isinstance(samples, int))):
            return None
    return record


def _plain_name(path: str) -> bool:
    """Whether `path` is a file name alone (`Path(path).name == path`), without a Path for each record: where
    "/" is the only separator, a string without one, but "." (pathlib's name of "." is "")."""
    if os.sep == "/" and os.altsep is None:
        return "/" not in path and path != "."
    return Path(path).name == path


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def audio_problem(path: Path, record: Done) -> str | None:
    """Why the audio file of a good record is damaged, or None when it holds what the record says.

    Cheap: the header and the file's last samples are read, never the whole file. The sample count
    libsndfile reports must equal the record's: for wav it follows from the data actually present
    (a file cut short reports fewer), for ogg from the last page. A flac header states the length it
    was written with even when the file was cut, so the last samples are decoded too, which a cut
    or corrupted tail fails. Damage inside an intact-length file is not detected.
    """
    import soundfile as sf

    if not path.is_file():
        return f"{path.name}: missing"
    if record.samples == 0:
        return None  # an item without audio: libsndfile cannot open an empty flac or ogg file
    try:
        with sf.SoundFile(str(path)) as handle:
            frames, rate = handle.frames, handle.samplerate
            if frames:
                handle.seek(frames - 1)
                if len(handle.read(1)) != 1:
                    return f"{path.name}: the last sample cannot be read"
    except Exception as exc:  # soundfile raises LibsndfileError, RuntimeError, ... for damaged files
        return f"{path.name}: unreadable ({str(exc).strip() or type(exc).__name__})"
    if record.samples is not None:
        if frames != record.samples:
            return f"{path.name}: {frames} samples, the record says {record.samples}"
    elif abs(frames - record.seconds * rate) > rate * 0.0005 + 1:  # seconds are rounded to 1 ms
        return f"{path.name}: {frames / rate:.3f} s long, the record says {record.seconds} s"
    return None


def check_log(out: Path) -> None:
    """Raise LedgerError if `out`'s result log is not a regular file omnitts may append to."""
    path = Path(out) / NAME
    if path.is_symlink() or (path.exists() and not path.is_file()):
        kind = "a symbolic link" if path.is_symlink() else "not a regular file"
        raise LedgerError(f"{path}: is {kind}; omnitts writes only inside the output directory (replace it "
                          "with a file, or choose another --out)")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # os.write may write part of it
        view = view[os.write(fd, view):]


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"
