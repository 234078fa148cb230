"""The `omnitts` command's entry point, light on purpose: it installs the stop signals' handler before the
command line's own modules (typer, rich: ~0.3 s) are imported, so that a Ctrl-C or SIGTERM at any moment of a
command says `interrupted` and exits 130 or 143, never with an import's traceback."""

from __future__ import annotations

import signal

from .stops import interrupt, stopped


def main():
    # SIGTERM stops as Ctrl-C does (synth: gracefully, once items run), exit 143; `cli.main` installs the same
    # handler again and runs the command.
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        from .cli import main as command
    except KeyboardInterrupt as exc:
        stopped(exc)
    command()


if __name__ == "__main__":
    main()
