"""The output folder's filesystem, asked before and while a run writes there: can OUT be made and written
(`check_out`, before anything runs), does it fold case so that `Alice.wav` and `alice.wav` are one file
(`folds_case`), and does it take an item's file name (`check_name`: a name too long fails that item alone).
Nothing here writes more than a probe file, named as omnitts' temporaries and deleted however the probe ends."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import OmniTTSError


class OutDirError(OmniTTSError):
    """The output directory cannot be created or written."""


class OutNameError(OmniTTSError):
    """One item's file name cannot be made in the output directory (the item fails, the run goes on)."""


def check_out(out: Path, flag: str = "--out", given: Path | None = None) -> None:
    """Raise OutDirError unless `out` is, or can be made, a directory omnitts can write; creates nothing.
    `flag`: the option named in the message; `given`: the path it was given, where `out` is that file's folder.

    Checked before anything runs: `out` (or the nearest part of its path that exists) must be a
    directory, writable, and not on a read-only filesystem. `Batch` then creates `out` and writes a
    probe file in it, which catches whatever this cannot see.
    """
    out = Path(out)
    existing = nearest_existing(out)
    where = f"{flag} {given or out}: " + ("" if existing == out and given is None else f"{existing} ")
    if not existing.is_dir():
        what = ("is a file" if existing.is_file() else "is a broken symbolic link" if existing.is_symlink()
                else "is a device, pipe or socket")
        raise OutDirError(f"{where}{what}, not a directory (choose a directory; omnitts creates it if missing)")
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise OutDirError(f"{where}is on a read-only filesystem (choose a writable {flag})")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutDirError(f"{where}is not writable: permission denied (choose a writable {flag})")


def nearest_existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists (the filesystem a missing `path` would be made on)."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def folds_case(folder: Path) -> bool:
    """Whether the filesystem of directory `folder` folds case, so that `Alice.wav` and `alice.wav` are one
    file there (macOS and Windows by default, vfat/exFAT, SMB shares); False where they are two (ext4).

    Probed with a temporary file whose name has lower-case letters: folded when its upper-cased name is the
    same file. The file is named as omnitts' temporaries (a kill leaves nothing a later run would not
    delete) and deleted however the probe ends.
    """
    from ..io.atomic import temp_name

    probe = Path(temp_name(folder / "probe"))
    try:
        return os.path.samefile(probe, probe.with_name(probe.name.upper()))
    except FileNotFoundError:  # no such upper-case name: the case matters
        return False
    finally:
        probe.unlink(missing_ok=True)


def case_folding(out: Path) -> Path | None:
    """`out` when its filesystem folds case (`folds_case`), else None, before `Batch` opens it (synth --strict
    reads the manifest first): probed in the nearest folder of its path that exists, on whose filesystem the
    missing ones would be made, so nothing is made. OutDirError when that folder takes no new file."""
    out = Path(out)
    try:
        return out if folds_case(nearest_existing(out)) else None
    except OSError as exc:
        raise OutDirError(f"--out {out}: cannot be written ({exc.strerror or exc})") from None


def check_name(target: Path) -> None:
    """Make and delete `target`'s temporary file, the longest name omnitts gives it; OutNameError if the
    filesystem refuses the name as too long, or a folder is where the file goes (the rename would fail once the
    item is synthesized, and stop the run as a write error); any other OSError is raised: it is the run's fault."""
    from ..io.atomic import temp_name

    if target.is_dir() and not target.is_symlink():
        raise OutNameError(f"id: {target} is a folder, where this item's file goes; move or rename that "
                           "folder, or give the line another id")
    try:
        Path(temp_name(target)).unlink()
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        raise OutNameError(too_long(target, exc)) from None


def too_long(target: Path, exc: OSError) -> str:
    from ..io.atomic import TEMP_EXTRA, shown_name

    target = Path(shown_name(target))
    return (f"id: the file name {target.name!r} ({len(os.fsencode(target.name))} bytes, and omnitts writes it under "
            f"a temporary name {TEMP_EXTRA} bytes longer) is too long for the filesystem of {target.parent} "
            f"({exc.strerror}); use a shorter id")
