"""The huge-page arena: tensors cut from 2 MiB-aligned, huge-page-advised memory that outlives the arena."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from omnitts.device import hugepages
from omnitts.device.hugepages import HUGE_PAGE, HugePageArena

needs_linux = pytest.mark.skipif(not hugepages.available(), reason="no madvise(MADV_HUGEPAGE) here")


def _thp_mode() -> str:
    """The bracketed choice in /sys/kernel/mm/transparent_hugepage/enabled ('' where absent)."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return ""
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else ""


def _huge_kib(address: int) -> int:
    """AnonHugePages (KiB) of the mapping holding `address`, from /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def _thp_fallbacks() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("thp_fault_fallback "):
            return int(line.split()[1])
    return 0


@needs_linux
def test_tensors_are_aligned_disjoint_and_outlive_the_arena():
    arena = HugePageArena(chunk_bytes=4 * HUGE_PAGE)
    first = arena.empty((100, 7), torch.bfloat16)
    second = arena.empty((3, 5), torch.float32)
    big = arena.empty((3 * HUGE_PAGE,), torch.float32)  # more than a chunk: a chunk of its own
    assert first.shape == (100, 7) and first.dtype == torch.bfloat16 and first.is_contiguous()
    assert second.shape == (3, 5) and big.numel() == 3 * HUGE_PAGE
    assert first.data_ptr() % HUGE_PAGE == 0 and big.data_ptr() % HUGE_PAGE == 0  # a chunk's start
    assert second.data_ptr() % hugepages.ALIGN == 0
    assert second.data_ptr() >= first.data_ptr() + first.numel() * 2  # after, not over, the first
    first.fill_(1.5)
    second.fill_(-2.0)
    big.fill_(3.0)
    del arena
    gc.collect()
    assert torch.all(first == 1.5) and torch.all(second == -2.0) and torch.all(big == 3.0)


@needs_linux
def test_memory_is_on_huge_pages_where_the_kernel_offers_them():
    if _thp_mode() not in ("always", "madvise"):
        pytest.skip(f"transparent huge pages are {_thp_mode() or 'absent'} here")
    fallbacks = _thp_fallbacks()
    weight = HugePageArena().empty((4 * HUGE_PAGE // 4,), torch.float32)
    weight.fill_(1.0)  # first touch: the faults take whole huge pages
    huge = _huge_kib(weight.data_ptr())
    if huge == 0 and _thp_fallbacks() > fallbacks:
        pytest.skip("the kernel had no free huge page (thp_fault_fallback rose)")
    assert huge >= 4 * HUGE_PAGE // 1024


def test_turned_off_gives_ordinary_tensors(monkeypatch):
    monkeypatch.setenv("OMNITTS_HUGEPAGES", "0")
    assert not hugepages.available()
    arena = HugePageArena()
    t = arena.empty((5, 3), torch.bfloat16)
    assert t.shape == (5, 3) and t.dtype == torch.bfloat16 and not arena.on


@needs_linux
def test_a_kernel_refusing_the_advice_still_gives_memory(monkeypatch):
    """A kernel without transparent huge pages answers madvise(MADV_HUGEPAGE) with EINVAL: the arena
    carries on with ordinary pages (an advice value no kernel knows stands in for that refusal)."""
    import mmap

    monkeypatch.setattr(mmap, "MADV_HUGEPAGE", 12345)
    region = mmap.mmap(-1, HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with pytest.raises(OSError):
        region.madvise(mmap.MADV_HUGEPAGE)
    t = HugePageArena().empty((1000,), torch.float32)
    t.fill_(2.5)
    assert torch.all(t == 2.5) and t.data_ptr() % HUGE_PAGE == 0
