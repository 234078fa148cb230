"""How a command stops on a signal that stops at once: Ctrl-C (SIGINT) or SIGTERM, exit 130 or 143.

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


def install() -> None:
    """SIGINT and SIGTERM stop at once (`interrupt`): SIGTERM as Ctrl-C does, and Ctrl-C also where the shell
    started omnitts with SIGINT ignored (a background job). SIGHUP (the terminal closed) stops as SIGTERM does,
    exit 129, unless it is ignored (`nohup`): then it stays so. synth's graceful stop takes them over once items
    run."""
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    if hangup_stops():
        signal.signal(signal.SIGHUP, interrupt)


def hangup_stops() -> bool:
    """Whether SIGHUP is ours to handle: it is not ignored (`nohup omnitts ...` ignores it, to run on)."""
    return signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN


def exit_code(exc: KeyboardInterrupt) -> int:
    """A stop's exit code: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP (`Interrupt` carries it)."""
    return getattr(exc, "exit_code", 130)


def stopped(exc: KeyboardInterrupt):
    """End the process as a stop does: one line, the signal's exit code."""
    sys.stderr.write("interrupted\n")
    sys.exit(exit_code(exc))
