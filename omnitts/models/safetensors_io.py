"""Reading safetensors files: the JSON header, and tensors as zero-copy views of a memory map.

A safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
data_offsets) and the raw tensor bytes. Loading maps the file once (copy-on-write, so a tensor is
writable without touching the file) and views each tensor where it lies: a checkpoint on a warm
page cache costs no read and no fresh memory for tensors that keep their stored dtype, which is
most of the start-up time on machines where first-touching anonymous memory is slow.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import warnings
from pathlib import Path

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


MAX_HEADER = 100 * 2**20  # bytes of JSON header at most (a larger length field is a damaged file, not a header)


def header_bytes(handle) -> bytes:
    """The JSON header of the safetensors file open as `handle`, at its start: the data section begins 8 bytes
    after its length. Raises ValueError for a file too short to hold its header (a truncated copy) or a length
    past MAX_HEADER."""
    head = handle.read(8)
    if len(head) < 8:
        raise ValueError(f"truncated: {len(head)} bytes long, too short for a safetensors file" + _INTERRUPTED)
    (size,) = struct.unpack("<Q", head)
    if size > MAX_HEADER:
        raise ValueError(f"header of {size} bytes")
    raw = handle.read(size)
    if len(raw) < size:
        raise ValueError(f"truncated: the file ends {len(raw):,} bytes into its {size:,}-byte header" + _INTERRUPTED)
    return raw


_INTERRUPTED = "; an interrupted copy or download?"


def parse_header(handle) -> tuple[bytes, dict]:
    """(the JSON header's bytes, the header) of the safetensors file open as `handle`, checked: its entries
    (`check_header`) and its length (`check_length`). Raises OSError/ValueError if malformed, truncated
    included: a file shorter than its header says its tensors are."""
    raw = header_bytes(handle)
    header = json.loads(raw)
    check_header(header)
    check_length(header, len(raw), os.fstat(handle.fileno()).st_size)
    return raw, header


def read_header(path: Path) -> tuple[dict, int]:
    """(header without `__metadata__`, offset of the data section), checked as `parse_header` checks it."""
    with open(path, "rb") as handle:
        raw, header = parse_header(handle)
    header.pop("__metadata__", None)
    return header, 8 + len(raw)


def check_length(header: dict, header_size: int, file_size: int) -> None:
    """ValueError if a file of `file_size` bytes is shorter than its (checked) `header` of `header_size` bytes
    says its tensors need: a truncated copy, refused whole before any tensor is read."""
    need = 8 + header_size + max((entry["data_offsets"][1] for name, entry in header.items()
                                  if name != "__metadata__"), default=0)
    if file_size < need:
        raise ValueError(f"truncated: its header needs a file of {need:,} bytes, this one holds {file_size:,}"
                         + _INTERRUPTED)


def check_header(header) -> None:
    """ValueError unless `header` is a JSON object of tensor entries, each with a dtype, a shape and data_offsets
    (what info, loading and the voice identity index: else a TypeError deep inside them)."""
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    for name, entry in header.items():
        if name != "__metadata__" and not (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
                                           and _counts(entry.get("shape")) and _counts(entry.get("data_offsets"), 2)):
            raise ValueError(f"tensor {name!r}: expected dtype, shape and data_offsets, got {str(entry)[:80]}")


def _counts(value, length: int | None = None) -> bool:
    """`value` is a list of non-negative integers (of `length` of them, if given)."""
    return (isinstance(value, list) and (length is None or len(value) == length)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value))


class MappedFile:
    """One safetensors file mapped into memory; `get(name)` views a tensor without copying it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.header, self._start = read_header(self.path)
        with open(self.path, "rb") as handle:
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)

    def keys(self):
        return self.header.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def get(self, name: str) -> torch.Tensor:
        entry = self.header[name]
        dtype = DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"tensor {name}: unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        count = (end - begin) // dtype.itemsize
        if count == 0:
            return torch.empty(entry["shape"], dtype=dtype)
        with warnings.catch_warnings():  # mmap buffers are fine to view; torch warns about any buffer
            warnings.simplefilter("ignore")
            flat = torch.frombuffer(self._map, dtype=dtype, count=count, offset=self._start + begin)
        return flat.view(entry["shape"])
