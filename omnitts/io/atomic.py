"""Writing a file so it never exists half-written: a temporary name beside it, then a rename.

Temporary names are `.<name>.<random>.tmp` in the target's folder (the same filesystem, so the rename
is atomic); `ledger.remove_leftovers` deletes those a killed run leaves behind.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def temp_name(path: Path) -> str:
    """Create an empty temporary file beside `path`, with the mode `open()` would give; return its name."""
    fd, tmp = tempfile.mkstemp(prefix=f".{Path(path).name}.", suffix=".tmp", dir=Path(path).parent)
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
