"""The columnar manifest readers (Parquet, Arrow, saved datasets) stream: memory stays far below the
file's size while its rows are read.

tracemalloc cannot see Arrow's allocator, so Arrow's own pool (`pyarrow.total_allocated_bytes`) is
sampled at every row, beside tracemalloc's peak for the Python objects made from the rows. A reader
that loads the whole file (or, for Parquet, pyarrow's default pre-buffered reading of a one-row-group
file) holds about the file's size at once and fails.
"""

from __future__ import annotations

import os
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omnitts.batch.sources import ArrowSource, DatasetSource, ParquetSource

ROWS, TEXT_CHARS = 12_000, 5_000  # ~60 MB of incompressible text


@pytest.fixture(scope="module")
def table():
    texts = os.urandom(ROWS * TEXT_CHARS // 2).hex()
    return pa.table({"id": [f"row-{i:05d}" for i in range(ROWS)],
                     "text": [texts[i * TEXT_CHARS:(i + 1) * TEXT_CHARS] for i in range(ROWS)],
                     "speaker": ["ryan"] * ROWS})


def _peaks(source) -> tuple[int, int, int]:
    """(rows read, peak bytes in Arrow's pool, peak bytes of Python allocations) while reading `source`."""
    base, pool_peak, count = pa.total_allocated_bytes(), 0, 0
    tracemalloc.start()
    try:
        for _, row in source.rows(["id", "text", "speaker"]):
            assert len(row["text"]) == TEXT_CHARS
            pool_peak = max(pool_peak, pa.total_allocated_bytes() - base)
            count += 1
        python_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return count, pool_peak, python_peak


def _assert_streams(source, path):
    size = path.stat().st_size
    assert size > 50e6
    count, pool_peak, python_peak = _peaks(source)
    assert count == ROWS
    path.unlink()
    # A few record batches at most (the one read, the one before it, a builder's spare capacity): ~17 MB
    # measured for Parquet, nothing for memory-mapped Arrow; a whole-file reader holds at least the file.
    limit = size / 3
    assert pool_peak < limit, f"Arrow pool peaked at {pool_peak / 1e6:.1f} MB reading a {size / 1e6:.0f} MB file"
    assert python_peak < limit, f"Python objects peaked at {python_peak / 1e6:.1f} MB of a {size / 1e6:.0f} MB file"


@pytest.mark.parametrize("row_group_size", [None, ROWS // 4], ids=["one-row-group", "four-row-groups"])
def test_parquet_rows_stream(table, tmp_path, row_group_size):
    path = tmp_path / "big.parquet"
    pq.write_table(table, path, row_group_size=row_group_size)
    _assert_streams(ParquetSource(path), path)


@pytest.mark.parametrize("form", ["file", "stream"])
def test_arrow_rows_stream(table, tmp_path, form):
    path = tmp_path / "big.arrow"
    with pa.OSFile(str(path), "wb") as sink:
        writer = pa.ipc.new_file if form == "file" else pa.ipc.new_stream
        with writer(sink, table.schema) as out:
            out.write_table(table, max_chunksize=ROWS // 4)
    _assert_streams(ArrowSource(path), path)


def test_saved_dataset_rows_stream(table, tmp_path):
    import datasets

    datasets.disable_progress_bars()
    folder = tmp_path / "ds"
    datasets.Dataset(table).save_to_disk(str(folder), max_shard_size="1GB")
    (path,) = folder.glob("*.arrow")  # one shard: the size measured is the whole dataset's
    _assert_streams(DatasetSource(folder), path)
