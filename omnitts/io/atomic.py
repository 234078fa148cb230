"""Writing a file so it never exists half-written: a temporary name beside it, then a rename.

Temporary names are `.<name>.omnitts-<random>.tmp` in the target's folder (the same filesystem, so the
rename is atomic); `ledger.remove_leftovers` deletes those a killed run leaves behind, and only those
(`is_temp_name`): a user's own `.something.tmp` is never touched.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left, disk quota exceeded
TEMP_MARK = ".omnitts-"  # between the target's name and mkstemp's random part
_TEMP = re.compile(r"\..+\.omnitts-[A-Za-z0-9_]{8}\.tmp\Z")


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` says the filesystem (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def is_temp_name(name: str) -> bool:
    """Whether file name `name` is one `temp_name` makes."""
    return _TEMP.match(name) is not None


def temp_name(path: Path) -> str:
    """Create an empty temporary file beside `path`, with the mode `open()` would give; return its name."""
    fd, tmp = tempfile.mkstemp(prefix=f".{Path(path).name}{TEMP_MARK}", suffix=".tmp", dir=Path(path).parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
    return tmp


@contextmanager
def atomic_write(path: Path) -> Iterator[str]:
    """Yield a temporary name to write; on success it replaces `path`, on any failure it is deleted."""
    tmp = temp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
