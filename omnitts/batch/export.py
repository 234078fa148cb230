"""Exporting an output directory's finished items as a Hugging Face `datasets` dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from .ledger import Ledger


def sf_rate(path: Path) -> int:
    import soundfile as sf

    return sf.info(str(path)).samplerate


def export_dataset(out: Path, items: Iterable, target: Path) -> int:
    """Write the done items of `items` (manifest order) as a `datasets` dataset with an Audio column.

    A row per item whose last record is good and whose file is intact (`Ledger.is_done`), with that
    record's seconds, frames and seed. Rows are appended one at a time to an Arrow file (then
    memory-mapped and saved with `save_to_disk`), so memory stays flat; returns the row count.

    The audio column is `Audio(decode=False)`: each row holds the file's encoded bytes and name, so
    `load_from_disk(target)[0]` works on any install. (datasets 4 decodes `Audio` with torchcodec,
    which needs a torch and FFmpeg libraries that match; omnitts does not depend on it.) Decode a row
    with `soundfile.read(io.BytesIO(row["audio"]["bytes"]))`, or, where torchcodec works,
    `dataset.cast_column("audio", datasets.Audio())`.
    """
    import shutil

    import datasets
    from datasets.arrow_writer import ArrowWriter

    datasets.disable_progress_bars()
    ledger = Ledger(out)
    features = datasets.Features({
        "id": datasets.Value("string"), "text": datasets.Value("string"), "language": datasets.Value("string"),
        "speaker": datasets.Value("string"), "instruct": datasets.Value("string"),
        "audio": {"bytes": datasets.Value("binary"), "path": datasets.Value("string")},
        "seconds": datasets.Value("float32"), "frames": datasets.Value("int32"), "seed": datasets.Value("int64"),
    })
    build = Path(target) / ".build"
    build.mkdir(parents=True, exist_ok=True)
    count, rate = 0, None
    with ArrowWriter(features=features, path=str(build / "rows.arrow")) as writer:
        for item in items:
            r = item.request
            if not ledger.is_done(r.id, out):
                continue
            rec = ledger.done[r.id]
            path = Path(out) / rec.path
            if rate is None and rec.samples != 0:  # (an empty flac or ogg file has no header)
                rate = sf_rate(path)
            writer.write({"id": r.id, "text": r.text, "language": r.language, "speaker": r.speaker or "",
                          "instruct": r.instruct or "", "audio": {"bytes": path.read_bytes(), "path": path.name},
                          "seconds": float(rec.seconds), "frames": int(rec.frames), "seed": rec.seed})
            count += 1
        writer.finalize()
    dataset = datasets.Dataset.from_file(str(build / "rows.arrow"))
    audio = datasets.Audio(sampling_rate=rate, decode=False)
    dataset.cast_column("audio", audio).save_to_disk(str(target))
    del dataset
    shutil.rmtree(build, ignore_errors=True)
    return count
