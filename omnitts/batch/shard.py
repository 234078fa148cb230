"""`--shard K/N`: which items one of N independently started processes takes.

An item belongs to shard `sha256(id) mod N` (the first 8 bytes of the digest, big-endian): the same on
every machine, Python version and run (Python's own `hash` is salted per process), and independent of
the manifest's order, so N processes given `--shard 0/N` .. `--shard N-1/N` (a Slurm array) cover a
manifest exactly once, and a re-run of one shard finds its own items again.
"""

from __future__ import annotations

import hashlib

from ..errors import OmniTTSError


class ShardError(OmniTTSError):
    """A --shard value that is not K/N with 0 <= K < N."""


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N); ShardError says what is wrong."""
    k, slash, n = str(text).strip().partition("/")
    try:
        k_i, n_i = int(k), int(n)
    except ValueError:
        k_i = n_i = -1
    if not slash or n_i < 1 or not 0 <= k_i < n_i:
        raise ShardError(f"--shard {text!r}: expected K/N with 0 <= K < N (e.g. 0/4 .. 3/4 for four processes)")
    return k_i, n_i


def shard_of(item_id: str, n: int) -> int:
    """The shard (0 .. n-1) of `item_id` among `n`."""
    digest = hashlib.sha256(item_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n


def in_shard(item_id: str, k: int, n: int) -> bool:
    return shard_of(item_id, n) == k
