"""Writing a file so it never exists half-written: a temporary name beside it, then a rename.

Temporary names are `.<name>.omnitts-<writer>-<random>.tmp` in the target's folder (the same filesystem,
so the rename is atomic). `<writer>` is this process's token (`writer_token`), which lets a directory shared
by several writers tell a live writer's files from a dead one's: `batch/claims.sweep` deletes only files
whose writer is gone, and only names omnitts made (`is_temp_name`): a user's `.something.tmp` is never touched.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left, disk quota exceeded
TEMP_MARK = ".omnitts-"  # between the target's name and mkstemp's random part
# bytes a temporary name adds to its target's: ".", TEMP_MARK, the writer token, "-", mkstemp's 8, ".tmp"
TEMP_EXTRA = 1 + len(TEMP_MARK) + 8 + 1 + 8 + len(".tmp")
# <writer>- is absent from names made before omnitts shared directories between writers
_TEMP = re.compile(r"\..+\.omnitts-(?:(?P<writer>[0-9a-f]{8})-)?[A-Za-z0-9_]{8}\.tmp\Z")
_token: tuple[int, str] | None = None  # (pid, token): a forked child makes its own


def writer_token() -> str:
    """This process's writer token: 8 hex digits, new in every process (a forked child's too)."""
    global _token
    if _token is None or _token[0] != os.getpid():
        _token = (os.getpid(), secrets.token_hex(4))
    return _token[1]


def temp_writer(name: str) -> str | None:
    """The writer token in temporary file name `name` ('' for a name from before tokens; None: not ours)."""
    match = _TEMP.match(name)
    return None if match is None else (match["writer"] or "")


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` says the filesystem (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def cannot_write(exc: OSError, out) -> str:
    """"cannot write OUT/ID.wav: Permission denied (EACCES)": a write error as a run's closing line names it (a
    temporary name shown as the file it stands for; `out` where the error names no file)."""
    where = shown_name(exc.filename) if exc.filename else out
    return f"cannot write {where}: {os_reason(exc)}"


def os_reason(exc: OSError) -> str:
    """An OSError's text with its errno's name, e.g. "Permission denied (EACCES)"."""
    code = errno.errorcode.get(exc.errno)
    return (exc.strerror or str(exc)) + (f" ({code})" if code else "")


def is_temp_name(name: str) -> bool:
    """Whether file name `name` is one `temp_name` makes."""
    return _TEMP.match(name) is not None


def shown_name(path) -> str:
    """`path` as a person should see it in an error: a temporary name as the file it stands for."""
    path = Path(path)
    if is_temp_name(path.name):
        return str(path.with_name(path.name[1:path.name.rindex(TEMP_MARK)]))
    return str(path)


def temp_name(path: Path) -> str:
    """Create an empty temporary file beside `path`, with the mode `open()` would give; return its name."""
    prefix = f".{Path(path).name}{TEMP_MARK}{writer_token()}-"
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=Path(path).parent)
    os.close(fd)
    os.chmod(tmp, file_mode())  # mkstemp makes 0600
    return tmp


def file_mode() -> int:
    """The mode `open()` gives a new file (0666 less the umask): what every file omnitts writes gets, also
    where a writer (mkstemp, safetensors) makes its file 0600."""
    return 0o666 & ~_umask()


@contextmanager
def atomic_write(path: Path) -> Iterator[str]:
    """Yield a temporary name to write; on success it replaces `path`, on any failure it is deleted.

    An OSError that names the temporary file (a folder that refuses new files: read-only, permission denied,
    /proc) is raised naming `path`, the file asked for, whose temporary name the caller never saw."""
    try:
        tmp = temp_name(path)
    except OSError as exc:
        raise _naming(exc, path) from None
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _naming(exc, path) from None
        raise


def _naming(exc: OSError, path: Path) -> OSError:
    """`exc`, or where it names a temporary file, the same error (errno, class) naming `path` instead."""
    if not exc.filename or not is_temp_name(Path(os.fsdecode(exc.filename)).name):
        return exc
    return OSError(exc.errno, exc.strerror, str(path))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
