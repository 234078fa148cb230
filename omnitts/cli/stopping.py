"""How a run stops on a signal: the first Ctrl-C, SIGTERM or SIGHUP stops starting items and lets the running
ones finish; a second interrupts at once (exit 128 + the signal). The parent of --workers also passes the
signal on to its workers where they did not get it themselves."""

from __future__ import annotations

import signal
import threading

from ..stops import Interrupt, taken
from .display import stop_eta


class GracefulStop:
    """First Ctrl-C or SIGTERM: stop starting items, finish the running ones. Second: interrupt at once.

    SIGTERM (what `kill`, schedulers and `docker stop` send) is handled as Ctrl-C is: the run exits 143;
    SIGHUP (the terminal closed) too, exit 129, unless it is ignored (`nohup`).
    """

    def __init__(self, console, progress=None):
        self.console = console
        self.progress = progress  # its ETA goes at the first signal
        self.count = 0
        self.exit_code = 130

    def requested(self) -> bool:
        return self.count > 0

    def _handle(self, signum, frame):
        self.count += 1
        if self.count > 1:
            raise Interrupt(signum)
        self.exit_code = 128 + signum
        if self.progress is not None:
            stop_eta(self.progress)
        again = "Ctrl-C" if signum == signal.SIGINT else f"{signal.Signals(signum).name} or Ctrl-C"
        self.console.print(f"stopping: finishing the items in progress ({again} again to drop them)")

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for number in taken():  # (nohup's SIGHUP stays ignored: a closed terminal does not stop the run)
                self.previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc):
        for number, handler in self.previous.items():
            signal.signal(number, handler)


class ForwardingStop(GracefulStop):
    """The parent of --workers: stops as GracefulStop does, and passes SIGTERM on to the workers (and a
    SIGINT the terminal did not already deliver to them: `kill -INT PID`, no terminal)."""

    def __init__(self, console, pool, progress=None):
        super().__init__(console, progress)
        self.pool = pool

    def _handle(self, signum, frame):
        from ..pool import terminal_signals_group

        self.pool.stopping = self.pool.stopping or signum  # workers ending 130/143 now were stopped, not died
        if signum != signal.SIGINT or not terminal_signals_group():
            self.pool.forward(signum)
        super()._handle(signum, frame)
