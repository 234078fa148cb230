"""A function of a file's contents, computed once per file version: `@per_version()` caches `fn(path, *args)` by
the path, the file's modification time and size (and the other arguments), so a file named on many manifest lines
is read once, and read again once it changes. The stat of each call raises OSError where the file cannot be
looked up; `cache_clear` and `cache_info` are lru_cache's."""

from __future__ import annotations

import functools
import os


def per_version(maxsize: int = 4096):
    def wrap(fn):
        @functools.lru_cache(maxsize=maxsize)
        def cached(path: str, mtime_ns: int, size: int, *args):
            return fn(path, *args)

        @functools.wraps(fn)
        def call(path, *args):
            stat = os.stat(path)
            return cached(os.fspath(path), stat.st_mtime_ns, stat.st_size, *args)

        call.cache_clear, call.cache_info = cached.cache_clear, cached.cache_info
        return call

    return wrap
