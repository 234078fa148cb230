"""Where omnitts keeps what it builds once per machine (the native CPU kernels)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$OMNITTS_CACHE_DIR`, else `~/.cache/omnitts`."""
    return Path(os.environ.get("OMNITTS_CACHE_DIR") or Path.home() / ".cache" / "omnitts")
