"""How a command stops on a signal that stops at once: Ctrl-C (SIGINT), SIGTERM or SIGHUP, exit 130, 143 or 129.

No import beyond the standard library: the entry point (`launch`) installs `interrupt` before anything else
is imported."""

from __future__ import annotations

import signal
import sys


class Interrupt(KeyboardInterrupt):
    """Raised by a signal that stops at once, with the exit code it calls for."""

    def __init__(self, signum: int):
        super().__init__()
        self.exit_code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def interrupt(signum, frame):
    raise Interrupt(signum)


STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the signals that stop a command: exit 130, 143, 129


def taken() -> list[int]:
    """The stop signals a handler takes over: all of `STOPS`, but SIGHUP where it is ignored (`nohup omnitts ...`
    ignores it, to run on after the terminal closes: it stays ignored). The same rule for `install`, synth's
    graceful stop and each --workers worker."""
    return [s for s in STOPS if s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN]


def install() -> None:
    """SIGINT and SIGTERM stop at once (`interrupt`): SIGTERM as Ctrl-C does, and Ctrl-C also where the shell
    started omnitts with SIGINT ignored (a background job). SIGHUP (the terminal closed) stops as SIGTERM does,
    exit 129, unless it is ignored (`taken`). synth's graceful stop takes them over once items run."""
    for signum in taken():
        signal.signal(signum, interrupt)


def exit_code(exc: KeyboardInterrupt) -> int:
    """A stop's exit code: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP (`Interrupt` carries it)."""
    return getattr(exc, "exit_code", 130)


def stopped(exc: KeyboardInterrupt):
    """End the process as a stop does: one line, the signal's exit code."""
    sys.stderr.write("interrupted\n")
    sys.exit(exit_code(exc))
