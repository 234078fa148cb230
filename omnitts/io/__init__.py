"""Audio files: reading references, writing audio atomically, loudness normalization; and the paths users give
(`user_path`, `unreachable`)."""

import os
from pathlib import Path


def user_path(value, name: str = "path") -> Path:
    """A path the user gave, `~` expanded as a shell would: every path omnitts takes reads "~/v.safetensors" as
    the one in the home folder. An unknown "~name" stays as written (its error then says "file not found").
    Anything but a string or path is a TypeError naming the argument `name` (pathlib's names none), an empty
    one a ValueError."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a path (a string or os.PathLike), got {type(value).__name__}")
    if os.fspath(value) == "":  # pathlib reads "" as ".": an unset variable would be the current folder
        raise ValueError(f"{name}: empty path (not read as the current folder); give a file or folder")
    path = Path(value)
    try:
        return path.expanduser()
    except RuntimeError:  # no such user, or no home folder
        return path


def unreachable(path, follow: bool = True) -> str | None:
    """Why `path` cannot be looked up at all (a name too long for the filesystem; for a user, a folder above it
    without search permission), or None, also for a missing path (the caller's to report): pathlib's checks raise
    that OSError before Python 3.12, and call it "not found" after. `follow=False`: `path` itself may be a link."""
    try:
        (os.stat if follow else os.lstat)(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
