"""The `omnitts` command's entry point, light on purpose: it installs the stop signals' handler before the
command line's own modules (typer, rich: ~0.3 s) are imported, so that a Ctrl-C or SIGTERM at any moment of a
command says `interrupted` and exits 130 or 143, never with an import's traceback."""

from __future__ import annotations

from .stops import install, stopped


def main():
    install()  # `cli.main` installs it again (for callers that enter there) and runs the command
    try:
        from .cli import main as command
    except KeyboardInterrupt as exc:
        stopped(exc)
    command()


if __name__ == "__main__":
    main()
