"""Audio files: reading references, writing audio atomically, loudness normalization; and the paths users give
(`user_path`, `unreachable`, `broken_link`)."""

import os
import re
from pathlib import Path

_URL = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://|data:)")  # https://..., file:///..., s3://..., data:audio/wav;base64


def url_problem(value) -> str | None:
    """Why `value` is no path, where it is a URL (the official package downloads `ref_audio` URLs and decodes
    data: URIs; omnitts runs offline), or None. pathlib keeps a URL as a path of one slash less
    ("https:/host/a.wav"), so "file not found" named a file nobody gave."""
    if isinstance(value, str) and _URL.match(value.strip()):
        return (f"{value[:80]!r} is a URL; omnitts reads local files only (it runs offline): "
                "download it first and give the file's path")
    return None


def user_path(value, name: str = "path") -> Path:
    """A path the user gave, `~` expanded as a shell would: every path omnitts takes reads "~/v.safetensors" as
    the one in the home folder. An unknown "~name" stays as written (its error then says "file not found").
    Anything but a string or path is a TypeError naming the argument `name` (pathlib's names none), an empty
    one or a URL a ValueError."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a path (a string or os.PathLike), got {type(value).__name__}")
    if os.fspath(value) == "":  # pathlib reads "" as ".": an unset variable would be the current folder
        raise ValueError(f"{name}: empty path (not read as the current folder); give a file or folder")
    if problem := url_problem(value):
        raise ValueError(f"{name}: {problem}")
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


def broken_link(path) -> str | None:
    """What a symbolic link `path` that leads nowhere points at, as the message to give instead of "file not found"
    (the name is there, in `ls`), or None for anything else. A Hugging Face cache snapshot holds links into the
    repository's blobs/ folder: `cp -r` of the snapshot alone copies the links, not the files."""
    path = Path(path)
    if not path.is_symlink() or path.exists():
        return None
    return (f"is a symbolic link to {os.readlink(path)}, which does not exist (a Hugging Face cache snapshot copied "
            "without its blobs/? copy it with cp -rL, or give the snapshot folder in the cache)")
