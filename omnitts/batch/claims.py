"""Many writers, one output directory: who runs an item, and whose leftovers may be deleted.

Any number of writers (`omnitts synth` processes, `--workers` children, Ray actors; on one machine or
several over a shared filesystem) may write into one output directory at once. The directory itself is
the only coordination, through two kinds of small files, both held with `flock`:

- `.omnitts-writer-<token>.lock`: one per writer (process), locked for as long as it writes there.
  `<token>` is `io.atomic.writer_token`, which is also part of every temporary file name the writer makes,
  so a file whose writer's lock is free (or gone) belongs to a dead writer and may be deleted.
- `.<id>.omnitts-claim`: an item is claimed before it runs by creating this file and locking it, and
  released after its result line is written (the file deleted, then unlocked). It names the writer, host
  and pid, for a person who looks, and says whether the item is running (in the engine, not merely
  claimed ahead).

An item's deaths: a claim whose writer died (its lock free) while the claim said "running" counts one death
of the item's process while the item ran. Such a claim is not deleted by `sweep`: the next writer to claim the
item reads it (`Writer.deaths`), and the run decides (batch/outdir.py): an item that was running when its
process died runs again alone; one whose process died while it ran alone is recorded failed without
running. The count stays in the claim until the item is recorded. A writer asked to stop (Ctrl-C,
SIGTERM) marks its running claims as stopping first (`Writer.stopping`), so a kill that follows (a
scheduler's SIGKILL after its grace period) is not counted; a writer whose device broke leaves its running
claims as they are (`Writer.abandon_running`): the next claimer counts that as a death too.

A lock, not a lease: the kernel (or the NFS server, once the client's lease ends) drops the locks of a
process that dies, however it dies, so a killed writer's claims are free at once for the others and no
heartbeat is needed. Claiming is race-free: the lock is taken without waiting, and then the name must
still point at the locked file (a claim released in between was deleted; then the claim is tried again).
The filesystem must support `flock` (local filesystems, NFSv4, CephFS, GPFS, Lustre mounted with `flock`);
one that refuses it is reported as such before anything runs.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path

from ..errors import OmniTTSError
from ..io.atomic import temp_writer, writer_token

CLAIM = ".omnitts-claim"  # after `.<id>`
WRITER = ".omnitts-writer-"  # before `<token>.lock`
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class ClaimError(OmniTTSError):
    """The output directory cannot be shared safely (its filesystem refuses file locks)."""


def _try_lock(fd: int, where: Path) -> bool:
    """Lock `fd` exclusively without waiting; False if another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in _NO_LOCKS:
            raise ClaimError(f"--out {where.parent}: its filesystem does not support file locks ({exc.strerror}); "
                             "omnitts needs them to share a directory between writers (use a local disk, NFSv4, "
                             "or mount Lustre with flock)") from None
        raise


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd` (it was not deleted or replaced meanwhile)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (mine.st_ino, mine.st_dev)


def open_locked(path: Path, create: bool) -> int | None:
    """Open and lock `path` (creating it if `create`), or None if a live holder has it (or it is gone)."""
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | (os.O_CREAT if create else 0)
    while True:
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symbolic link where a claim belongs: never followed
                raise ClaimError(f"{path}: is a symbolic link; omnitts writes only inside the output directory")
            raise
        try:
            if not _try_lock(fd, path):
                os.close(fd)
                return None
            if _same_file(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # released and deleted between our open and our lock: try again (or: gone)
        if not create:
            return None


def _stamp(fd: int, **fields) -> None:
    data = json.dumps({"writer": writer_token(), "host": socket.gethostname(), "pid": os.getpid(),
                       "since": round(time.time(), 3), **fields}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _read_stamp(fd: int) -> dict:
    """What a claim file says ({} for an empty, torn or foreign one)."""
    try:
        stamp = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def deaths_in(stamp: dict) -> tuple[int, bool]:
    """(deaths of the item's process while it ran, whether the last one came while it ran alone), as a claim
    whose writer is gone tells them: the deaths it carried, and one more if it was running."""
    count = stamp.get("deaths") if isinstance(stamp.get("deaths"), int) else 0
    alone = bool(stamp.get("died_alone"))
    if stamp.get("running") is True:
        count, alone = count + 1, bool(stamp.get("alone"))
    return max(0, count), alone and count > 0


def _history(deaths: tuple[int, bool]) -> dict:
    return {"deaths": deaths[0], "died_alone": deaths[1]} if deaths[0] else {}


_held: dict[Path, list] = {}  # lock file -> [descriptor, Writers of this process using it]


class Writer:
    """This process as a writer of output directory `out`: its lock, and the items it has claimed.

    Several Writers of one process on one directory share the process's lock (one token), but not their
    claims: each claim is its own locked open file, so they exclude each other as two processes do.
    """

    def __init__(self, out: Path):
        self.out = Path(out)
        self.token = writer_token()
        self.lock_path = Path(os.path.realpath(self.out)) / f"{WRITER}{self.token}.lock"
        self.claims: dict[str, int] = {}  # item id -> the locked claim file's descriptor
        self.deaths: dict[str, tuple[int, bool]] = {}  # item id -> `deaths_in` its claim when claimed (if any)
        self.running_ids: set[str] = set()  # claims stamped running (`running`)
        # Claims are made on the run's main thread and released on its saver's: a descriptor is never
        # written after another thread closed it (its number could name another file by then).
        self._lock = threading.RLock()
        self._open = False
        held = _held.get(self.lock_path)
        if held is None or not _same_file(held[0], self.lock_path):
            fd = open_locked(self.lock_path, create=True)
            if fd is None:
                raise ClaimError(f"--out {self.out}: {self.lock_path.name} is locked by another process")
            _stamp(fd)
            held = _held[self.lock_path] = [fd, 0]
        held[1] += 1
        self._open = True

    def claim(self, item_id: str) -> bool:
        """Claim `item_id` for this writer; False if another live writer holds it. Idempotent. A claim a dead
        writer left behind is read first: its item's deaths go to `deaths` (and stay in the claim)."""
        with self._lock:
            if item_id in self.claims:
                return True
            fd = open_locked(self._claim_path(item_id), create=True)
            if fd is None:
                return False
            deaths = deaths_in(_read_stamp(fd))
            try:
                _stamp(fd, id=item_id, **_history(deaths))
            except BaseException:  # a full disk: the claim (created, unstamped) goes, unless it carries deaths
                if not deaths[0]:
                    self._claim_path(item_id).unlink(missing_ok=True)
                os.close(fd)
                raise
            if deaths[0]:
                self.deaths[item_id] = deaths
            self.claims[item_id] = fd
            return True

    def running(self, item_id: str, alone: bool = False) -> None:
        """`item_id` has entered the engine (`alone`: with no other item beside it): if this process dies
        from now until the item is released, the next claimer counts a death."""
        with self._lock:
            fd = self.claims.get(item_id)
            if fd is None:
                return
            _stamp(fd, id=item_id, running=True, alone=alone, **_history(self.deaths.get(item_id, (0, False))))
            self.running_ids.add(item_id)

    def settled(self, item_id: str) -> None:
        """`item_id` has left the engine (it is being saved): a death from now on is not its doing."""
        with self._lock:
            if item_id in self.running_ids:
                self.running_ids.discard(item_id)
                _stamp(self.claims[item_id], id=item_id, **_history(self.deaths.get(item_id, (0, False))))

    def stopping(self) -> None:
        """A stop was asked (a signal): a kill from now on is the stop's doing, not a running item's."""
        with self._lock:
            for item_id in list(self.running_ids):
                _stamp(self.claims[item_id], id=item_id, **_history(self.deaths.get(item_id, (0, False))))
            self.running_ids.clear()

    def abandon_running(self) -> None:
        """The device broke under the running items: let their claims go as a dead writer's would (left in
        place, still saying running), so the next claimer counts a death for each."""
        with self._lock:
            for item_id in list(self.running_ids):
                os.close(self.claims.pop(item_id))
            self.running_ids.clear()

    def release(self, item_id: str, recorded: bool = True) -> None:
        """Give `item_id` up: after its result line is written (`recorded`: the file goes, then the lock), or
        unrun (`recorded` False: a claim that carries deaths keeps them for the next claimer)."""
        with self._lock:
            fd = self.claims.pop(item_id, None)
            self.running_ids.discard(item_id)
            deaths = self.deaths.pop(item_id, (0, False))
            if fd is None:
                return
            try:
                if not recorded and deaths[0]:
                    _stamp(fd, id=item_id, **_history(deaths))
                else:
                    self._claim_path(item_id).unlink(missing_ok=True)
            finally:
                os.close(fd)

    def close(self) -> None:
        """Release every claim (unrun) and this writer's lock (a killed process's are dropped by the kernel).

        Best effort on the files: in a directory turned read-only a claim or the lock file cannot be deleted.
        Each is unlocked all the same (its descriptor closed), so the next writer's sweep deletes it."""
        with self._lock:
            for item_id in list(self.claims):
                try:
                    self.release(item_id, recorded=False)
                except OSError:
                    pass  # the run is ending on that error already (the CLI says it in one line)
        if not self._open:
            return
        self._open = False
        held = _held.get(self.lock_path)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del _held[self.lock_path]
            try:
                if _same_file(held[0], self.lock_path):
                    self.lock_path.unlink(missing_ok=True)
            except OSError:
                pass  # as a claim above: unlocked below, swept by the next writer
            finally:
                os.close(held[0])

    def __del__(self):  # a Writer dropped without close() (a library user's Batch) frees its claims
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the os module may be half gone
            pass

    def _claim_path(self, item_id: str) -> Path:
        return self.out / f".{item_id}{CLAIM}"


def live_writers(out: Path) -> set[str]:
    """Tokens of the writers alive in `out` (this process always); dead ones' lock files are deleted."""
    live = {writer_token()}
    for path in Path(out).glob(f"{WRITER}*.lock"):
        token = path.name[len(WRITER):-len(".lock")]
        if token == writer_token():
            live.add(token)
            continue
        fd = open_locked(path, create=False)
        if fd is None:
            live.add(token)  # locked: its writer runs (or it vanished just now)
            continue
        try:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return live


def clear_stopped(out: Path, since: float, wait: float = 10.0) -> int:
    """Clear the running marks that writers taken down by a stop left: the Ray actors of a command stopped by
    Ctrl-C or SIGTERM (Ray ends them mid-item). As `Writer.stopping` does for a writer that stops itself, the
    stop counts no death of their items (two stops had an innocent item recorded failed, "died twice"). Only
    claims stamped running since `since` (the command's start, `time.time()`) are touched, each once its writer
    is gone (its lock free), waiting up to `wait` seconds for writers still going down. Returns how many."""
    deadline, cleared = time.monotonic() + wait, 0
    while True:
        pending = 0
        for path in Path(out).glob(f".*{CLAIM}"):
            try:
                stamp = json.loads(path.read_bytes() or b"{}")
            except (OSError, ValueError):
                continue
            if not (isinstance(stamp, dict) and stamp.get("running") is True
                    and isinstance(stamp.get("since"), (int, float)) and stamp["since"] >= since):
                continue
            fd = open_locked(path, create=False) if path.is_file() and not path.is_symlink() else None
            if fd is None:
                pending += path.exists()  # its writer is still going down (or it was released just now)
                continue
            try:
                stamp = _read_stamp(fd)  # as it is now that its writer is gone
                if stamp.get("running") is True:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, json.dumps({k: v for k, v in stamp.items() if k not in ("running", "alone")}).encode(), 0)
                    cleared += 1
            finally:
                os.close(fd)
        if not pending or time.monotonic() > deadline:
            return cleared
        time.sleep(0.2)


def sweep(out: Path, kept: set | None = None) -> int:
    """Delete what dead writers left in `out`: their temporary files and unreleased claims, except claims
    that carry an item's deaths (`deaths_in`: the next claimer of the item reads them; their ids are added
    to `kept` if given). Returns how many were deleted.

    Only names omnitts makes are touched (`io.atomic.is_temp_name`, `.<id>.omnitts-claim`), and only
    regular files; a live writer's files are never touched (its lock is held).
    """
    out = Path(out)
    live = live_writers(out)
    removed = 0
    for path in out.glob(".*.tmp"):
        writer = temp_writer(path.name)
        if writer is None or writer in live or not path.is_file() or path.is_symlink():
            continue
        path.unlink(missing_ok=True)
        removed += 1
    for path in out.glob(f".*{CLAIM}"):
        if path.is_symlink() or not path.is_file():
            continue
        fd = open_locked(path, create=False)
        if fd is None:
            continue  # a live writer's claim
        try:
            if deaths_in(_read_stamp(fd))[0]:  # an item's deaths: kept for its next claimer
                if kept is not None:
                    kept.add(path.name[1:-len(CLAIM)])
                continue
            path.unlink(missing_ok=True)
            removed += 1
        finally:
            os.close(fd)
    return removed
