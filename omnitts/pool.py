"""The parent's side of `--workers` / `--devices`: the worker processes (workers.py) of one run.

`Pool` starts one worker per device (multiprocessing's spawn context), reads each one's pipe, adds their
tallies into one and yields what the terminal should show; it starts again a worker that died or whose
device broke. The CLI owns the terminal.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from .stops import STOPS
from .workers import Plan, worker_main

STOP_CODES = tuple(128 + s for s in STOPS)  # a worker's exit code after one of them: 130, 143, 129


@contextmanager
def _stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread meanwhile (one that comes waits, pending, until they are
    unblocked); the signal mask is then restored as it was."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


MAX_RESTARTS = 3  # times a worker killed by a signal (or whose device broke) is started again, per device and run


@dataclass
class Ended:
    """A worker that ended without finishing: `reason` says how (killed by SIGKILL, exited with code 1)."""

    index: int
    device: str
    reason: str
    stopped: bool  # stopped by a signal of ours (Ctrl-C, SIGTERM), not died
    restarted: int = 0  # started again on its device: the how-manieth time (0: not started again)
    broke: bool = False  # it stopped because its device broke (it said so: an "error" event of kind "device")


class Pool:
    """The worker processes of one run, seen from the parent.

    `events()` yields, in arrival order: ("loading", index), ("record", index, id, status, error,
    seconds), ("error", index, message, kind) and ("ended", Ended) for a worker that did not finish
    normally; it returns when every worker has ended. A worker killed by a signal we did not send (the
    out-of-memory killer, a crash) or stopped because its device broke (a new process gets a new device
    context) is started again on its device, up to MAX_RESTARTS times: the items it was running are
    counted a death each in their claims, so the new worker (or another) runs them alone, and one that
    kills its process alone too is recorded failed (batch/claims.py); the run goes on. A worker that
    stopped for another error (a full disk, a bad checkpoint) is not. `tally` (the parent batch's, holding pass 1's
    bad lines) gets every worker's counts added: done, failed and audio seconds from their records
    (each item is saved by one worker); changed (and damaged) items summed (counted by the worker that records
    them); skipped and earlier failed as the largest any worker saw (every worker walks the whole
    manifest and sees the same earlier results). A worker counts its siblings' items as "others":
    the parent works out the command's own `others` at the end (cli).

    A worker says ("saving", index, id) before it writes an item's record, and reports the record after.
    One killed between the two (the out-of-memory killer does not wait) wrote a record nobody reported:
    `ledger` (the parent batch's, opened where this command began) is read then, and a record of that
    id written since is counted, and yielded, as that worker's.
    """

    def __init__(self, plan: Plan, devices: list[str], tally, ledger=None):
        self.plan, self.devices, self.tally, self.ledger = plan, devices, tally, ledger
        self.procs: list = []
        self.conns: dict = {}  # reader -> worker index
        self.snapshots: dict[tuple, tuple] = {}  # (index, start) -> a worker process's counts
        self.starts = Counter()  # index -> times its worker was started
        self.base = [tally.skipped, tally.earlier_failed, tally.changed, tally.damaged]
        self.saving: dict[int, str] = {}  # index -> the id its worker is writing the record of
        self.recovered: set[str] = set()  # ids counted from the ledger for a worker that died unreported
        self.errors: dict[int, tuple[str, str]] = {}  # index -> (message, kind)
        self.stopping = 0  # signal number we stopped with (0: none)
        self.graphs = Counter()  # the workers' graph capture costs added up (`Pipeline.graph_stats`)

    def start(self) -> None:
        self.procs = [None] * len(self.devices)
        for index in range(len(self.devices)):
            self._spawn(index)

    def _spawn(self, index: int) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        reader, writer = context.Pipe(duplex=False)
        proc = context.Process(target=worker_main, args=(index, self.devices[index], self.plan, writer),
                               name=f"omnitts-worker-{index}", daemon=False)
        # The new process inherits the signal mask: a stop that reaches it while it is still starting
        # (importing torch, before worker_main has its handlers) waits instead of killing it mid-import.
        # The resource tracker is started first: starting it unblocks these signals on the way out.
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        with _stop_signals_held():
            proc.start()
        writer.close()  # the worker holds the only write end: its exit is our end-of-file
        self.procs[index] = proc
        self.conns[reader] = index
        self.starts[index] += 1

    def forward(self, signum: int) -> None:
        """Send `signum` to every live worker (a SIGTERM to the parent; a SIGINT that the terminal did not
        deliver to the whole process group)."""
        self.stopping = self.stopping or signum
        for proc in self.procs:
            if proc.exitcode is None and proc.pid is not None:
                try:
                    os.kill(proc.pid, signum)
                except ProcessLookupError:
                    pass

    def events(self) -> Iterator[tuple]:
        from multiprocessing.connection import wait

        while self.conns:
            for reader in wait(list(self.conns), timeout=0.5):
                index = self.conns[reader]
                try:
                    event = reader.recv()
                except Exception:  # EOFError: it exited; anything else: killed mid-message
                    del self.conns[reader]
                    reader.close()
                    yield from self._recover(index)
                    ended = self._reap(index)
                    if ended is not None:
                        ended.broke = self.errors.get(index, ("", ""))[1] == "device"
                        if self._restartable(ended):
                            self.errors.pop(index, None)  # the new worker's own errors are its own
                            self._spawn(index)
                            ended.restarted = self.starts[index] - 1
                        yield ("ended", ended)
                    continue
                yield from self._note(event)

    def _note(self, event: tuple) -> Iterator[tuple]:
        kind, index = event[0], event[1]
        if kind in ("loading", "tally"):
            self._count(index, event[-1])
            if kind == "loading":
                yield ("loading", index)
        elif kind == "saving":
            self.saving[index] = event[2]
        elif kind == "record":
            _, _, item_id, status, error, seconds, snapshot = event
            self.saving.pop(index, None)
            if item_id in self.recovered:  # counted already: another worker's record of it was read first
                self.recovered.discard(item_id)
                self._count(index, snapshot)
                return
            if status == "ok":
                self.tally.done += 1
                self.tally.seconds += seconds
            else:
                self.tally.fail(item_id, error)
            self._count(index, snapshot)
            yield event[:6]
        elif kind == "error":
            self.errors[index] = (event[2], event[3])
            yield event
        elif kind == "warning":
            yield event
        elif kind == "graphs":
            self.graphs.update(event[2])

    def _recover(self, index: int) -> Iterator[tuple]:
        """Count the record that worker `index`, now gone, was writing when it ended, if it wrote it."""
        item_id = self.saving.pop(index, None)
        if item_id is None or self.ledger is None:
            return
        self.ledger.refresh()
        if not self.ledger.ours(item_id):
            return  # not written (or by another command): its claim is free, and it runs again
        self.recovered.add(item_id)
        done = self.ledger.done.get(item_id)
        if done is not None:
            self.tally.done += 1
            self.tally.seconds += done.seconds
            status, error, seconds = "ok", None, done.seconds
        else:
            status, error, seconds = "error", self.ledger.failed.get(item_id, ""), 0.0
            self.tally.fail(item_id, error)
        why = self.ledger.replaced.get(item_id)
        if why is not None:  # its worker counted it in no snapshot it sent
            self.base[2] += 1
            self.base[3] += why
            snapshot = self.snapshots.get((index, self.starts[index]))
            if snapshot is not None:
                self._count(index, snapshot)
        yield ("record", index, item_id, status, error, seconds)

    def _restartable(self, ended: Ended) -> bool:
        """Killed by a signal not ours, or its device broke; not yet started again MAX_RESTARTS times."""
        code = self.procs[ended.index].exitcode
        died = code is not None and code < 0 and ended.index not in self.errors
        return (died or ended.broke) and not self.stopping and self.starts[ended.index] <= MAX_RESTARTS

    def _count(self, index: int, snapshot: tuple) -> None:
        self.snapshots[index, self.starts[index]] = snapshot
        skipped, earlier_failed, changed, damaged = zip(*self.snapshots.values())
        self.tally.skipped = self.base[0] + max(skipped)
        self.tally.earlier_failed = self.base[1] + max(earlier_failed)
        self.tally.changed = self.base[2] + sum(changed)
        self.tally.damaged = self.base[3] + sum(damaged)

    def _reap(self, index: int) -> Ended | None:
        proc = self.procs[index]
        proc.join(timeout=30)
        if proc.exitcode is None:  # closed its pipe yet lingers: make sure it is gone
            proc.kill()
            proc.join()
        code = proc.exitcode
        if code == 0:
            return None
        if code < 0:
            reason = f"killed by {signal.Signals(-code).name}"
        elif code in STOP_CODES:
            reason = f"stopped by {signal.Signals(code - 128).name}"
        else:
            reason = f"exited with code {code}"
        return Ended(index, self.devices[index], reason, stopped=bool(self.stopping) and code in STOP_CODES)

    def all_finished(self) -> bool:
        """Every worker ended normally (exit code 0): each walked the whole manifest."""
        return all(proc.exitcode == 0 for proc in self.procs)

    def alive(self) -> int:
        """Workers still reporting."""
        return len(self.conns)

    def shutdown(self, grace: float = 10.0) -> None:
        """Wait up to `grace` seconds for the workers to end (after a stop), then kill the rest."""
        import time

        deadline = time.monotonic() + grace
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        for reader in list(self.conns):
            reader.close()
        self.conns.clear()


def terminal_signals_group() -> bool:
    """Whether a Ctrl-C reaches the workers from the terminal itself: this process group is the
    foreground group of the controlling terminal. Otherwise (no terminal, `kill -INT PID`) the parent
    forwards SIGINT to them."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)
