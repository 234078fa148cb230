"""Where omnitts keeps what it builds once per machine (the native CPU kernels)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$OMNITTS_CACHE_DIR`, else `~/.cache/omnitts`. A `~` the shell left in the variable (a quoted value, a
    Dockerfile's ENV, a systemd unit) is the home folder, as in every path omnitts takes, not a folder named `~`."""
    return Path(os.environ.get("OMNITTS_CACHE_DIR") or Path.home() / ".cache" / "omnitts").expanduser()
