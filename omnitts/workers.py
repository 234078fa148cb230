"""`omnitts synth --workers N` / `--devices LIST`: one engine process per device, one output directory.

The parent (the CLI) validates the manifest once, then starts one worker per device with
multiprocessing's spawn context (a fork would copy a parent's torch threads and device state). Each
worker loads the checkpoint once and runs the single-process loop (run.py) with its own `Batch` on the
shared directory, iterating every good item of the manifest: the batch's claims decide who runs what,
so items are pulled dynamically (no static split, no long tail behind a slow worker), and the items a
dead worker had claimed are taken over by the others once the kernel releases its locks.

Workers print nothing. Each reports to the parent over its own pipe: a killed worker can then tear
only its own channel (the parent sees end-of-file), never hold a lock the others need, as a
shared Queue's writer lock could be. The parent's `Pool` adds their tallies into one and yields what
the terminal should show; the CLI owns the terminal.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import DeviceFailed, OmniTTSError
from .stops import STOPS, taken

ACCELERATORS = ("cuda", "npu")
STOP_CODES = tuple(128 + s for s in STOPS)  # a worker's exit code after one of them: 130, 143, 129
MAX_WORKERS = 1024  # worker processes on one machine at most: a list of a billion (a typo) is refused, not built
_ENTRY = re.compile(r"^(cpu|cuda|npu)(?::(\d+)(?:-(\d+))?)?$")


class DevicesError(OmniTTSError):
    """--workers / --devices cannot be used as given."""


def parse_devices(devices: str | None, workers: int | None, device: str) -> list[str] | None:
    """The device of each worker, or None for the single-process run (neither flag, or `--workers 1`).

    `devices`: comma-separated `cpu`, `cuda:I`, `npu:I` or ranges `cuda:A-B` (`cpu,cpu` is two CPU
    workers). `workers` N with `device` D: D:0 .. D:N-1 on an accelerator, N CPU workers on the CPU.
    Both given: they must agree. Raises DevicesError with one line naming the flag.
    """
    if workers is not None and workers < 1:
        raise DevicesError(f"--workers {workers}: give 1 or more")
    if workers is not None and workers > MAX_WORKERS:
        raise DevicesError(f"--workers {workers}: one engine process per device, and no machine has that many (at "
                           f"most {MAX_WORKERS}; more machines: --ray)")
    if devices is None:
        if workers is None or workers == 1:
            return None
        return [f"{device}:{i}" for i in range(workers)] if device in ACCELERATORS else ["cpu"] * workers
    listed: list[str] = []
    for entry in devices.split(","):
        entry = entry.strip()
        match = _ENTRY.match(entry)
        if not match:
            raise DevicesError(f"--devices {devices!r}: {entry!r} is not a device (write cpu, cuda:0, npu:3 or a "
                               "range such as npu:0-7, separated by commas)")
        kind, first, last = match.groups()
        if kind == "cpu":
            if first is not None:
                raise DevicesError(f"--devices {devices!r}: {entry!r}: cpu takes no index (cpu,cpu is two CPU "
                                   "workers)")
            listed.append("cpu")
        elif first is None:
            raise DevicesError(f"--devices {devices!r}: {entry!r}: name the {kind} device's index ({kind}:0)")
        else:
            last = first if last is None else last
            if int(last) < int(first):
                raise DevicesError(f"--devices {devices!r}: {entry!r}: the range ends before it starts")
            if len(listed) + int(last) - int(first) + 1 > MAX_WORKERS:
                raise DevicesError(f"--devices {devices!r}: more devices than a machine has (one worker each, at "
                                   f"most {MAX_WORKERS}; more machines: --ray)")
            listed += [f"{kind}:{i}" for i in range(int(first), int(last) + 1)]
    kinds = sorted({name.split(":")[0] for name in listed})
    if len(kinds) > 1:
        raise DevicesError(f"--devices {devices!r}: mixes {' and '.join(kinds)}; one kind per run")
    if workers is not None and workers != len(listed):
        counted = f"{len(listed)} device" + ("" if len(listed) == 1 else "s")
        raise DevicesError(f"--workers {workers} and --devices {devices!r} ({counted}) disagree; give one of them")
    return listed


def kind_of(device: str) -> str:
    return device.split(":")[0]


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_threads(devices: list[str]) -> int | None:
    """Torch threads per CPU worker: the cores split between them (None on accelerators: torch's default)."""
    if kind_of(devices[0]) != "cpu":
        return None
    return max(1, cpu_cores() // len(devices))


@dataclass
class Plan:
    """What every worker needs to run its share: picklable, sent once at start."""

    manifest: Path
    model: Path
    columns: dict | None
    out: Path
    settings: object  # outdir.Settings
    load_kwargs: dict  # omnitts.load's keyword arguments; `device` is replaced by the worker's kind
    threads: int | None = None
    shard: tuple[int, int] | None = None  # --shard K/N: this command's share of the manifest
    since: int | None = None  # where this command began in results.jsonl: later records are this run's
    run: str | None = None  # this command's run token (Batch.run): what the workers' records carry
    fold_case: Path | None = None  # the parent's Batch.fold_case: workers take the duplicates its pass 1 took


def name(index: int, device: str) -> str:
    return f"worker {index} ({device})"


@contextmanager
def _stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread meanwhile (one that comes waits, pending, until they are
    unblocked); the signal mask is then restored as it was."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


# -- the worker process ------------------------------------------------------------------------------

class _Stop:
    """A worker's signals: the first SIGINT/SIGTERM/SIGHUP finishes the running items, a second stops at once.
    A worker whose parent is gone stops as after a first signal (no one would see its reports).

    One stop may reach a worker twice: sent to the whole process group (Slurm's scancel signals every process
    of the step, `kill -TERM -PGID`, a closed terminal's SIGHUP) and passed on by the parent too. The same
    signal again within `ECHO` seconds is that echo, not a second stop: counted, it dropped the running items."""

    ECHO = 0.5  # seconds; the parent passes a signal on within milliseconds, a person's second Ctrl-C takes longer

    def __init__(self):
        self.count, self.exit_code, self.orphaned = 0, 0, False
        self.parent = os.getppid()
        self._last = (None, 0.0)  # (signal, time.monotonic()) of the last one counted

    def handle(self, signum, frame):
        now = time.monotonic()
        if self._last[0] == signum and now - self._last[1] < self.ECHO:
            return
        self._last = (signum, now)
        self.count += 1
        self.exit_code = 128 + signum
        if self.count > 1:
            raise KeyboardInterrupt

    def requested(self) -> bool:
        if os.getppid() != self.parent:
            self.orphaned = True
        return self.count > 0 or self.orphaned


def worker_main(index: int, device: str, plan: Plan, conn) -> None:
    """A worker process: the single-process loop on `device`, reporting over `conn`; exits 0, or 130/143
    when a signal stopped it, 2 for an omnitts error (bad checkpoint, device), 1 for any other."""
    stop = _Stop()
    for signum in taken():  # (nohup's ignored SIGHUP stays ignored)
        signal.signal(signum, stop.handle)

    sending = threading.Lock()  # the main thread (warnings) and the saver thread (records) both send

    def send(*event) -> None:
        try:
            with sending:
                conn.send(event)
        except OSError:  # the parent is gone: stop as after a first signal
            stop.orphaned = True

    code = 0
    batch = None
    # Python warnings (a reference clip over 30 s) go to the parent, which says each once as the CLI does
    warnings.showwarning = lambda message, *args, **kwargs: send("warning", index, str(message))
    try:
        # Started with them held (Pool._spawn): one that came meanwhile arrives now, to our handlers.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        import torch

        if plan.threads is not None:  # before torch does any work: CPU workers split the cores
            torch.set_num_threads(plan.threads)
        _pin(device)
        batch, items = _open(plan)
        tally = batch.tally

        def load():
            from .api import load as load_tts

            send("loading", index, _snapshot(tally))
            return load_tts(plan.model, **{**plan.load_kwargs, "device": kind_of(device)})

        def report(record: dict) -> None:
            send("record", index, record["id"], record["status"], record["error"], record["seconds"] or 0.0,
                 _snapshot(tally))

        from .batch.run import run_items

        stats = {}
        run_items(batch, items, load, stop.requested, report, stats,
                  saving=lambda item_id: send("saving", index, item_id))
        send("tally", index, _snapshot(tally))
        if stats:
            send("graphs", index, stats)
        code = stop.exit_code if stop.count else 0
    except KeyboardInterrupt:
        code = stop.exit_code or 130
    except DeviceFailed as exc:  # the parent starts it again (a new device context); its running claims count deaths
        send("error", index, str(exc), "device")
        code = 1
    except OmniTTSError as exc:
        send("error", index, str(exc), "usage")
        code = 2
    except OSError as exc:
        from .io.atomic import cannot_write, disk_full

        if disk_full(exc):
            send("error", index, str(exc), "disk")
        else:  # a write error (EACCES, EROFS, EIO...): the parent ends the run naming the file, as one process does
            send("error", index, cannot_write(exc, plan.out), "write")
        code = 1
    except Exception as exc:  # reported by the parent, which names the worker
        send("error", index, f"{type(exc).__name__}: {exc}", "crash")
        code = 1
    finally:
        if batch is not None:
            batch.close()  # releases its claims now, not at exit
        conn.close()
    sys.exit(code)


def _pin(device: str) -> None:
    """Make `device`'s index the process's current device, so that "cuda" / "npu" mean it."""
    if ":" not in device:
        return
    kind, index = device.split(":")
    import torch

    if kind == "cuda":
        torch.cuda.set_device(int(index))
    elif kind == "npu":
        from .device.npu import import_torch_npu

        import_torch_npu()
        torch.npu.set_device(int(index))


def _open(plan: Plan):
    """The worker's Batch on the shared directory and its lazy iterator of the manifest's good items."""
    from .config import load_config
    from .voice import checkpoint_identity
    from .batch.manifest import BadLine, iter_manifest
    from .batch.outdir import Batch

    cfg = load_config(plan.model)
    batch = Batch(plan.out, plan.settings, cfg, checkpoint_identity(plan.model), shard=plan.shard, since=plan.since,
                  run=plan.run)
    items = (entry for entry in iter_manifest(plan.manifest, cfg, plan.columns, plan.settings.split_chars,
                                              plan.fold_case, plan.settings.max_frames,
                                              plan.settings.official_tokenizer)
             if not isinstance(entry, BadLine))
    return batch, items


def _snapshot(tally) -> tuple:
    """The counts of a worker's walk through the manifest that its records do not carry."""
    return tally.skipped, tally.earlier_failed, tally.changed, tally.damaged


# -- the parent ---------------------------------------------------------------------------------------

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
