"""One output directory of a manifest run: what is done, what to run, and writing results.

    batch = Batch(out, settings, config, identity)
    for job in batch.pending(items): ...         # skips what an earlier run finished, as the items are now
    record = batch.save(outcome)                 # audio file (atomic) first, then its ledger line

Invariants that make interruption safe at any instant (Ctrl-C, SIGKILL, power loss):
- an audio file appears only by atomic rename of a finished temporary file (`.<name>.*.tmp`), and
  the temporary files of dead writers are deleted when a run starts and ends (claims.sweep);
- several writers may share `out` (claims.py): an item runs only while its writer holds its claim, and
  after claiming, the log is read again, so an item another writer recorded meanwhile is not run twice;
- a `results.jsonl` line is appended (and fsynced) only after its file is in place, so a line never
  points at a missing or partial file; a line torn by a kill is ignored;
- the log is append-only and the last record of an id wins (ledger.py): an item run again adds a
  line, which replaces the earlier one for every reader;
- "done" means the id's last record is good and its file holds what the record says (its sample
  count, from the header and the last samples: `ledger.audio_problem`); anything else runs again,
  and the atomic rename replaces, never duplicates, a file. Nothing is written outside `out`;
- a save that fails part-way (a full disk) removes the files it placed and raises: the item has no
  record and runs again, and the caller stops the run (the CLI: one line, exit 1).
The terminal belongs to the CLI: this module only returns records (ledger.record) and counts (tally.py).
Exports: export.py.
"""

from __future__ import annotations

import errno
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ..engine.jobs import Job, Outcome
from ..params import SamplingParams
from .claims import Writer, sweep
from .fingerprint import fingerprint, same_print
from .folder import OutDirError, case_folding, check_name, too_long
from .ledger import CODES, Ledger, check_log, new_run, record
from .settings import Settings
from .shard import in_shard
from .tally import Tally


RETRY_EVERY = 0.2  # seconds between looks at items another writer holds
DEFERRED_LOOK = 256  # held items kept before looking whether their writers finished them
PARAMS_KEPT = 1024  # distinct sets of per-line sampling overrides whose parameters a Batch keeps built
BAD_LINES_PER_WRITE = 256  # bad lines recorded with one fsync (one each took ~1 ms a line on an SSD, more on network disks)


class Batch:
    """`out` for one writer's run: `config` and `identity` are the checkpoint's (config.json,
    voice.checkpoint_identity), which an item's sampling defaults and fingerprint come from; `shard`
    (k, n) keeps only the items of shard k of n (shard.py). A context manager: `close` gives up this
    writer's claims and lock (a killed process's are dropped by the kernel)."""

    def __init__(self, out: Path, settings: Settings, config=None, identity: str | None = None,
                 sample_rate: int = 24000, shard: tuple[int, int] | None = None, since: int | None = None,
                 run: str | None = None):
        self.out = Path(out)
        self.sample_rate = sample_rate  # of the checkpoint's audio (every 12 Hz codec gives 24 kHz)
        self.settings = settings
        self.config, self.identity = config, identity
        self.shard = shard
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            check_log(self.out)
            self.writer = Writer(self.out)
            self.dead: set[str] = set()  # ids whose claims carry deaths (claims.py): cleared if found done
            self.leftovers = sweep(self.out, self.dead)
            # out when its filesystem folds case (ids `Alice` and `alice` name one file): the manifest's
            # readers take it as `iter_manifest(fold_case=...)`. The probe also shows that out takes new files.
            self.fold_case: Path | None = case_folding(self.out)  # (OutDirError when out takes no new file)
        except OSError as exc:  # what check_out cannot see (e.g. a filesystem that refuses new files)
            raise OutDirError(f"--out {self.out}: cannot be written ({exc.strerror or exc})") from None
        # since: where the run this writer belongs to began; run: its token, which every record written here
        # carries and which tells the records of the run's other processes (a command's workers, a Ray run's
        # actors) from other commands' (Ledger.ours). None: a token of its own for its records, and every
        # record another writer makes counts as the run's.
        self.run = run or new_run()
        self.ledger = Ledger(self.out, since, run)
        self.tally = Tally()
        self._prints: dict[str, str] = {}  # id -> fingerprint, for the jobs handed out and not yet saved
        # Jobs handed out and not yet saved that run an item again because its line or the options changed:
        # `tally.changed` counts them as their records are written, so an item that two processes take up
        # (a worker started again after it died) counts once, as it is recorded once.
        self.rerun: dict[str, bool] = {}  # id -> whether it is for a damaged or missing file (not a change)
        self._looked = 0.0  # when held items were last looked at
        self._params: dict[tuple, SamplingParams] = {}  # (greedy, max_frames, overrides) -> params (`_unseeded`)

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Give up this writer's claims, delete what dead writers left, and leave the directory."""
        writer = getattr(self, "writer", None)  # None: __init__ failed before it joined the directory
        if writer is None:
            return
        writer.close()  # its claims, then its lock (this process's temporary files stay live for sweep)
        try:
            sweep(self.out)
        except OSError:
            pass  # a directory gone or unwritable at the end: nothing of ours is left in it anyway

    def mine(self, item_id: str) -> bool:
        """Whether `item_id` is this writer's to run (in its shard, if it has one)."""
        return self.shard is None or in_shard(item_id, *self.shard)

    # -- what to run ------------------------------------------------------------------------------
    def record_bad(self, item_id: str, message: str) -> None:
        """A line that failed validation: recorded once (not again on every re-run, nor by every writer)."""
        self.record_bad_lines([(item_id, message)])

    def record_bad_lines(self, lines: Iterable[tuple[str, str]]) -> None:
        """`record_bad` for each (id, message) of `lines`, a few hundred to a write (one fsync each). Once:
        a line recorded with this message already, by an earlier run or another writer, is not written
        again (the log's lock decides between writers, without a claim per line)."""
        def recorded(rec: dict) -> bool:
            return self.ledger.failed.get(rec["id"]) == rec["error"]

        chunk = []
        for item_id, message in lines:
            if not self.mine(item_id):
                continue
            self.tally.fail(item_id, message)
            chunk.append(record(item_id, "error", error=message, run=self.run))
            if len(chunk) >= BAD_LINES_PER_WRITE:
                self.ledger.write_all(chunk, unless=recorded)
                chunk = []
        self.ledger.write_all(chunk, unless=recorded)

    def pending(self, items: Iterable) -> Iterator[Job | None]:
        """Jobs for the items an earlier run (or another writer) has not finished *as they are now*.

        Skipped: an item whose last record is good, whose file is intact and whose fingerprint matches
        (the same line and options made it); one that failed with the same fingerprint, unless
        `retry_failed`; one another writer recorded during this run (`tally.others`). Run: everything
        else - new items, damaged files, and items whose line or options changed since their record
        (`rerun`, counted in `tally.changed` when saved; the old file is replaced atomically). `force` runs
        every item once.

        Each job is claimed before it is yielded (released by `save`). An item another live writer
        holds is looked at again later: it is usually recorded by then; if its writer died, it is run
        here. While only such items are left, None is yielded ("nothing now, ask again").
        """
        held: dict[str, tuple[Job, str]] = {}  # id -> (job, fingerprint): another writer held it
        for item in items:
            item_id = item.request.id
            if not self.mine(item_id):
                continue
            job = self.job(item)
            current = self._fingerprint(job)
            if self._skip(job, current):
                if item_id in self.dead:  # recorded after all (its writer died after the record, say)
                    self.dead.discard(item_id)
                    if self.writer.claim(item_id):
                        self.writer.release(item_id)  # recorded: the claim and its deaths go
                continue
            if not self.writer.claim(item_id):
                held[item_id] = (job, current)
                if len(held) >= DEFERRED_LOOK:  # bounded: those writers have mostly recorded them by now
                    yield from self._look(held, wait=False)
                continue
            if self._still_to_run(job, current):
                yield self._start(job, current)
        while held:
            yield from self._look(held, wait=True)
            if held:
                yield None

    def _look(self, held: dict, wait: bool) -> Iterator[Job]:
        """Jobs of `held` items whose writers let them go without recording them (they died)."""
        if wait and time.monotonic() - self._looked < RETRY_EVERY:
            return
        self._looked = time.monotonic()
        self.ledger.refresh()
        for item_id, (job, current) in list(held.items()):
            if self._skip(job, current):
                del held[item_id]
            elif self.writer.claim(item_id):
                del held[item_id]
                if self._still_to_run(job, current):
                    yield self._start(job, current)

    def _still_to_run(self, job: Job, current: str) -> bool:
        """After claiming: read the log again (another writer may have recorded it and let it go just
        now); if it has, count it and release the claim."""
        self.ledger.refresh()
        if self._skip(job, current):
            self.writer.release(job.request.id)
            return False
        return True

    def _skip(self, job: Job, current: str) -> bool:
        """Whether `job`'s item (fingerprint `current`) is not to run; counts why in the tally."""
        why = self._settled(job, current)
        if why == "others":
            self.tally.others += 1  # another writer ran it during this run, as this writer would have
        elif why is not None:
            self.tally.skipped += 1
            self.tally.earlier_failed += why == "failed"
        return why is not None

    def _settled(self, job: Job, current: str) -> str | None:
        """Why `job`'s item (fingerprint `current`) is not to run: "others" (another writer recorded it during
        this run), "done", "failed" (an earlier run failed it as it is now, without --retry-failed); None:
        it is to run."""
        ledger, s, item_id = self.ledger, self.settings, job.request.id
        if item_id in ledger.arrived and (self._done_as(item_id, current, job)
                                          or same_print(ledger.failed_prints.get(item_id, ""), current, old=False)):
            return "others"
        if s.force:
            return None
        if self._done_as(item_id, current, job):
            return "done"
        if item_id in ledger.failed and same_print(ledger.failed_prints[item_id], current, old=False) \
                and not s.retry_failed:
            return "failed"
        return None

    def count_to_run(self, items: Iterable, most: int) -> int:
        """How many of `items` this writer would run now (`pending`'s rule), counted up to `most`: a look
        that claims, records and tallies nothing. An item another writer is running counts as to run."""
        count = 0
        for item in items:
            if count >= most:
                break
            if self.mine(item.request.id):
                job = self.job(item)
                count += self._settled(job, self._fingerprint(job)) is None
        return count

    def _start(self, job: Job, current: str) -> Job:
        """A claimed item's job. One whose process died while it ran (its claim says so, `Writer.deaths`)
        runs alone; one whose process died while it ran alone fails without running."""
        item_id, ledger = job.request.id, self.ledger
        why = None if self.settings.force else False if self._retries(job) else ledger.rerun_of(item_id, current)
        if why is not None:  # not skipped: a changed line or options, or a file damaged or missing
            self.rerun[item_id] = why
        self._prints[item_id] = current
        deaths, alone = self.writer.deaths.get(item_id, (0, False))
        if alone:
            return replace(job, fail=f"the process running this item died {deaths_text(deaths)} while it ran, the "
                                     "last time alone (a crash, or the out-of-memory killer): it is not run again; "
                                     "--retry-failed tries it once more")
        return replace(job, alone=True) if deaths else job

    def give_back(self, job: Job) -> None:
        """Let a job that `pending` handed out go unrun: its claim released, as if it had not been handed out."""
        item_id = job.request.id
        self.rerun.pop(item_id, None)
        self._prints.pop(item_id, None)
        self.writer.release(item_id, recorded=False)

    def started(self, job: Job) -> None:
        """The pipeline put `job`'s item in its engine: from now a death of this process is counted against it."""
        self.writer.running(job.request.id, alone=job.alone)

    def job(self, item) -> Job:
        """A manifest item as a pipeline job: sampling from the checkpoint, the flags and the item."""
        s = self.settings
        seed = item.seed if item.seed is not None else s.seed
        max_frames = None if item.request.max_seconds is not None else s.max_frames  # the line's own wins
        params = self._unseeded(max_frames, item.sampling)
        if seed is not None:
            params = replace(params, seed=seed)
        request = item.request
        if item.voice_path is not None:  # loaded (once per file, identity-checked) by tts.prepare
            request = replace(request, voice=item.voice_path)
        return Job(request, params, key=item)

    def _unseeded(self, max_frames: int | None, sampling: dict) -> SamplingParams:
        """An item's sampling parameters before its seed: the checkpoint's defaults, the flags and the line's
        overrides (`Item.sampling`). Built once per distinct set of them: most lines share one. Keyed by each
        value's type too (a temperature of 1 and one of 1.0 are written apart in the fingerprint)."""
        greedy = self.settings.greedy
        key = (greedy, max_frames, tuple((name, type(value), value) for name, value in sampling.items()))
        params = self._params.get(key)
        if params is None:
            params = SamplingParams.from_generation_config(self.config.generation, max_frames=max_frames,
                                                           **sampling)
            params = params.greedy() if greedy else params
            if len(self._params) >= PARAMS_KEPT:  # lines that each set their own: memory stays flat
                self._params.clear()
            self._params[key] = params
        return params

    def is_current(self, item) -> bool:
        """Whether `item`'s audio in `out` is done and was made from the item as it is now."""
        return self._done_as(item.request.id, self._fingerprint(self.job(item)))

    def _fingerprint(self, job: Job) -> str:
        s = self.settings
        return fingerprint(job.request, job.params, self.identity, s.format, s.loudness, s.split_chars,
                           s.official_tokenizer)

    def _done_as(self, item_id: str, current: str, job: Job | None = None) -> bool:
        """The id's last record is good, made from fingerprint `current`, and its file is intact (with
        `--save-codes`, its codes file is there too and the record names it, a codes file beside a record without
        codes being someone else's: a run that adds the flag writes the codes it lacks; given the `job` to run,
        it is no runaway that `--retry-runaway` now retries further, `_retries`)."""
        done = self.ledger.done.get(item_id)
        return (done is not None and same_print(done.fingerprint, current) and self.ledger.is_done(item_id, self.out)
                and (not self.settings.save_codes
                     or (done.codes is not False and (self.out / f"{item_id}.codes.npy").is_file()))
                and not (job is not None and self._retries(job)))

    def _retries(self, job: Job) -> bool:
        """Whether the item's good record is a runaway (sampled, it ran out of the budget derived from its text)
        retried fewer times than `--retry-runaway` allows now: it runs again, as after a change of the options
        (--retry-runaway is not in the fingerprint: an item that ended by itself is not redone for it)."""
        done, params = self.ledger.done.get(job.request.id), job.params
        return (done is not None and done.finish_reason == "length" and isinstance(done.attempts, int)
                and done.attempts < 1 + self.settings.retry_runaway and params.samples
                and params.max_frames is None and job.request.max_seconds is None)

    # -- writing ----------------------------------------------------------------------------------
    def save(self, outcome: Outcome) -> dict:
        """Write an outcome's audio (and codes), then its ledger line; returns the record.

        If any of it fails (a full disk, a second Ctrl-C), the files this call put in place are removed
        again and the error is raised: nothing stays without its record, no space is held by a file
        nobody vouches for, and the item runs again on resume.
        """
        item_id = outcome.job.request.id
        self.writer.settled(item_id)
        if not outcome.ok:
            rec = record(item_id, "error", seed=outcome.seed, error=outcome.error, timings=outcome.timings,
                         fingerprint=self._prints.pop(item_id, None), run=self.run)
            written = False
            try:
                self.ledger.write(rec)
                written = True
            finally:
                self.writer.release(item_id, recorded=written)
            self.tally.fail(item_id, outcome.error)
            self._count_rerun(item_id)
            return rec
        result, s = outcome.result, self.settings
        name = f"{item_id}.{s.format}"
        placed, written = [], False
        try:
            if s.save_codes:  # codes first: the ledger line (written last) vouches for both files
                _save_npy(self.out / f"{item_id}.codes.npy", result.codes.astype(np.int64))
                placed.append(self.out / f"{item_id}.codes.npy")
            if outcome.sink is not None:
                placed.append(outcome.sink.commit())
            else:  # an outcome from a pipeline without sinks
                if s.loudness is not None:
                    from ..io.loudness import normalize_loudness

                    result.samples = normalize_loudness(result.samples, result.sample_rate, s.loudness)
                placed.append(result.save(self.out / name))
            named = self.ledger.named.get(item_id, frozenset())  # before this record joins them
            rec = record(item_id, "ok", path=name, seconds=round(outcome.seconds, 3), samples=outcome.samples,
                         frames=result.frames, finish_reason=result.finish_reason, seed=outcome.seed,
                         seeds=outcome.seeds, attempts=outcome.attempts, pieces=outcome.pieces,
                         timings=outcome.timings, fingerprint=self._prints.pop(item_id, None),
                         codes=f"{item_id}.{CODES}" if s.save_codes else None, run=self.run)
            self.ledger.write(rec)
            written = True
        except BaseException as exc:
            if outcome.sink is not None:
                outcome.sink.abort()
            for path in placed:
                Path(path).unlink(missing_ok=True)
            if not (isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG):
                raise
            # A name the filesystem refuses (missed by `sink`'s check) is this item's fault, not the run's.
            error = too_long(Path(exc.filename or self.out / name), exc)
            return self.save(replace(outcome, result=None, sink=None, error=error))
        finally:
            self.writer.release(item_id, recorded=written)
        self._drop_earlier(item_id, keep=placed, named=named)
        self.tally.done += 1
        self.tally.seconds += outcome.seconds
        self._count_rerun(item_id)
        return rec

    def _drop_earlier(self, item_id: str, keep: list, named: frozenset) -> None:
        """Delete the item's files that an earlier run wrote and this one did not: audio in another format
        (`--format` changed) and codes (`--save-codes` dropped), which would otherwise stay beside the new
        audio, the codes no longer its codes. `named`: the suffixes of the files the id's earlier ok records
        named (`Ledger.named`, "codes.npy" for codes): only those are omnitts' (a user's `x.wav` beside item `x`,
        written as flac, is not, nor `x.codes.npy` beside a record without codes). Only after the
        new record is written: the last record never names a file that is gone. Best effort: a file that
        cannot be deleted stays (it is named by no record that counts)."""
        from ..io.audio import FORMATS

        kept = {Path(path).name for path in keep}
        names = [f"{item_id}.{suffix}" for suffix in sorted(named) if suffix in FORMATS]
        for name in names + ([f"{item_id}.codes.npy"] if CODES in named else []):
            if name not in kept:
                try:
                    (self.out / name).unlink(missing_ok=True)
                except OSError:
                    pass

    def _count_rerun(self, item_id: str) -> None:
        if item_id in self.rerun:
            self.tally.rerun(self.rerun.pop(item_id))

    def sink(self, job: Job):
        """Where a job's audio streams to: a temporary file in `out`, renamed by `save`.

        Called when the job is prepared, before it runs: a file name the filesystem refuses (a valid id
        too long for it, with the temporary name's affix) raises OutNameError, which fails that item only.
        """
        from ..io.audio import AudioSink

        item_id = job.request.id
        path = self.out / f"{item_id}.{self.settings.format}"
        for target in [path] + ([self.out / f"{item_id}.codes.npy"] if self.settings.save_codes else []):
            check_name(target)
        return AudioSink(path, self.sample_rate, self.settings.loudness)


def deaths_text(count: int) -> str:
    return {1: "once", 2: "twice"}.get(count, f"{count} times")


def _save_npy(path: Path, array: np.ndarray) -> None:
    """np.save, atomically (temporary name in the same folder, then rename)."""
    from ..io.atomic import atomic_write

    with atomic_write(path) as tmp, open(tmp, "wb") as handle:
        np.save(handle, array)
