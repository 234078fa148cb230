"""Host memory on transparent huge pages for the weights every batch-1 step streams.

A batch-1 frame reads the talker's packed weights once and the code predictor's 15 times (~3.3 GB for
the 0.6B model), front to back. On 4 KiB pages that is ~800k page-table walks a frame, and hardware
prefetchers stop at each 4 KiB boundary. Linux backs a region on 2 MiB pages when asked
(`madvise(MADV_HUGEPAGE)`; `/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` or `always`),
but a region torch allocates is neither asked nor 2 MiB-aligned. `HugePageArena` maps private anonymous
chunks, 2 MiB-aligned, asks for huge pages before anything touches them, and hands out tensors from
them; pages never touched (a chunk's unused tail) cost no memory.

Measured on this project's 2-core AVX-512 EPYC VM, in one process, alternating 4 KiB -> 2 MiB pages: over
0.9 GB of packed weights the bfloat16 GEMV read 41 -> 48 GB/s, float32 over bfloat16-stored weights
31 -> 33, a plain `sum` 40 -> 54 (a fast phase; in slow ones ~5% apart); the 0.6B batch-1 step (median
of 8 rounds of 4) 98.1 -> 90.0 ms in float32, 96.2 -> 87.3 in bfloat16, the bfloat16 batch-8 step
148.8 -> 138.9.

The price is at load, on VMs like that one: first-touching 1.1 GB of huge pages took 0.6-1.3 s where
4 KiB pages took 0.3 s, and up to ~5 s more right after another large process exited (the host
probably backs each freshly used 2 MiB block again). A batch run repays it after a few hundred frames;
`OMNITTS_HUGEPAGES=0` keeps the faster load for short jobs.

Where the OS has no such call (not Linux), or `OMNITTS_HUGEPAGES=0`, tensors come from torch's own
allocator: same values, just the 4 KiB pages.
"""

from __future__ import annotations

import math
import mmap
import os
import sys

import torch

HUGE_PAGE = 2 << 20
CHUNK_BYTES = 256 << 20  # mapped at a time; untouched pages cost nothing
ALIGN = 64  # each tensor starts on a cache line


def available() -> bool:
    """Whether this process can ask for huge pages (Linux, and not turned off by `OMNITTS_HUGEPAGES=0`)."""
    return (sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE")
            and os.environ.get("OMNITTS_HUGEPAGES", "1") != "0")


class HugePageArena:
    """Hands out uninitialised tensors (`empty`) from 2 MiB-aligned memory advised onto huge pages.

    A chunk's memory lives as long as any tensor cut from it (each tensor keeps its chunk's mapping
    alive), so the arena itself can be dropped once the weights are placed.
    """

    def __init__(self, chunk_bytes: int = CHUNK_BYTES):
        self.chunk_bytes = chunk_bytes
        self.on = available()
        self._chunk: torch.Tensor | None = None  # uint8 view of the current chunk, 2 MiB-aligned
        self._used = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if not self.on:
            return torch.empty(shape, dtype=dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        start = -(-self._used // ALIGN) * ALIGN
        if self._chunk is None or start + nbytes > self._chunk.numel():
            self._chunk = self._map(max(self.chunk_bytes, nbytes))
            start = 0
        self._used = start + nbytes
        return self._chunk[start:start + nbytes].view(dtype).view(shape)

    @staticmethod
    def _map(nbytes: int) -> torch.Tensor:
        size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
        region = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            region.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: faults then take whole huge pages
        except OSError:
            pass  # a kernel built without transparent huge pages refuses (EINVAL): 4 KiB pages, same memory
        raw = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` alive while any view lives
        skip = -raw.data_ptr() % HUGE_PAGE
        return raw[skip:skip + size]
