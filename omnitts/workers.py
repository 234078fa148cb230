"""`omnitts synth --workers N` / `--devices LIST`: one engine process per device, one output directory.

The parent (the CLI) validates the manifest once, then starts one worker per device with
multiprocessing's spawn context (a fork would copy a parent's torch threads and device state). Each
worker loads the checkpoint once and runs the single-process loop (run.py) with its own `Batch` on the
shared directory, iterating every good item of the manifest: the batch's claims decide who runs what,
so items are pulled dynamically (no static split, no long tail behind a slow worker), and the items a
dead worker had claimed are taken over by the others once the kernel releases its locks.

Workers print nothing. Each reports to the parent over its own pipe: a killed worker can then tear
only its own channel (the parent sees end-of-file), never hold a lock the others need, as a
shared Queue's writer lock could be. The parent's `Pool` (pool.py) adds their tallies into one and
yields what the terminal should show; the CLI owns the terminal.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from .errors import DeviceFailed, OmniTTSError
from .stops import STOPS, taken

ACCELERATORS = ("cuda", "npu")
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
    settings: object  # batch.settings.Settings
    load_kwargs: dict  # omnitts.load's keyword arguments; `device` is replaced by the worker's kind
    threads: int | None = None
    shard: tuple[int, int] | None = None  # --shard K/N: this command's share of the manifest
    since: int | None = None  # where this command began in results.jsonl: later records are this run's
    run: str | None = None  # this command's run token (Batch.run): what the workers' records carry
    fold_case: Path | None = None  # the parent's Batch.fold_case: workers take the duplicates its pass 1 took


def name(index: int, device: str) -> str:
    return f"worker {index} ({device})"


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
